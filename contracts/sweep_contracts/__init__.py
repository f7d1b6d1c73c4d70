"""The contracts the operator and the training image share: API models, run spec, runtime env codec, S3 layout,
checkpoint manifest. No kopf, Kubernetes client or boto3."""
