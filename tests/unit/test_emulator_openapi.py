"""The emulator's OpenAPI documents (sandbox/openapi.py): what kubectl reads from /openapi/v3 and /openapi/v2."""

from __future__ import annotations

from sweep_sandbox import emulator, openapi


def sweep_type() -> emulator.ResourceType:
    (resource_type,) = emulator.ResourceType.from_crd(emulator.sweep_crd())
    return resource_type


def test_the_patch_operation_carries_the_kind_and_field_validation() -> None:
    """kubernetes/kubernetes staging/src/k8s.io/cli-runtime/pkg/resource/query_param_verifier_v3.go
    supportsQueryParamV3: a PATCH whose x-kubernetes-group-version-kind is the kind and whose parameters name
    fieldValidation; without it kubectl falls back to client-side validation from /openapi/v2."""
    document = openapi.group_version_document([sweep_type()])
    patch = document["paths"]["/apis/sweeps.dev/v1alpha1/namespaces/{namespace}/trainingsweeps/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {
        "group": "sweeps.dev",
        "kind": "TrainingSweep",
        "version": "v1alpha1",
    }
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]
    assert "application/apply-patch+yaml" in patch["requestBody"]["content"]
    assert "/apis/sweeps.dev/v1alpha1/namespaces/{namespace}/trainingsweeps/{name}/status" in document["paths"]


def test_the_published_schema_is_the_crds_with_object_meta_referenced() -> None:
    """kubernetes/kubernetes staging/src/k8s.io/apiextensions-apiserver/pkg/controller/openapi/builder/builder.go
    BuildOpenAPIV3: metadata refers to ObjectMeta, the GVK extension is a list, and the CRD's descriptions are what
    kubectl explain prints."""
    document = openapi.group_version_document([sweep_type()])
    schemas = document["components"]["schemas"]
    published = schemas["dev.sweeps.v1alpha1.TrainingSweep"]
    assert published["x-kubernetes-group-version-kind"] == [
        {"group": "sweeps.dev", "kind": "TrainingSweep", "version": "v1alpha1"}
    ]
    assert published["properties"]["metadata"]["allOf"] == [
        {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    ]
    crd_spec = sweep_type().openapi["properties"]["spec"]
    assert (
        published["properties"]["spec"]["properties"]["deadlines"]["description"]
        == crd_spec["properties"]["deadlines"]["description"]
    )
    assert "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" in schemas
    assert "dev.sweeps.v1alpha1.TrainingSweepList" in schemas


def test_swagger_v2_refers_to_definitions() -> None:
    """kubernetes/kube-openapi pkg/builder/openapi.go (v2) and apiextensions builder.go BuildOpenAPIV2: #/definitions/
    references, no `nullable`."""
    document = openapi.swagger_document([sweep_type()])
    assert document["swagger"] == "2.0"
    published = document["definitions"]["dev.sweeps.v1alpha1.TrainingSweep"]
    assert (
        published["properties"]["metadata"]["allOf"][0]["$ref"]
        == "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    )
    assert "nullable" not in str(document)


def test_definition_names_reverse_the_group() -> None:
    """apiserver/pkg/endpoints/openapi/openapi.go (kubernetes/kubernetes staging) definition namer ( the group
    reversed, k8s.io groups as io.k8s.api.*)."""
    assert openapi.definition_name("sweeps.dev", "v1alpha1", "TrainingSweep") == "dev.sweeps.v1alpha1.TrainingSweep"
    assert openapi.definition_name("ray.io", "v1", "RayJob") == "io.ray.v1.RayJob"
    assert openapi.definition_name("", "v1", "Pod") == "io.k8s.api.core.v1.Pod"
    assert openapi.definition_name("batch", "v1", "Job") == "io.k8s.api.batch.v1.Job"
