"""The contracts the operator and the training image share: the API models, the run spec, the runtime env codec,
the S3 layout and the checkpoint manifest. Pure: they import neither kopf, the Kubernetes client nor boto3."""
