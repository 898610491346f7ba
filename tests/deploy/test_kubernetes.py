"""The Kubernetes manifests (conf/kubernetes/): valid for the Kubernetes API, consistent with the
config they carry and the image they run, and the ConfigMap's config run for real as a pod would.

Schemas: kubernetes-validate (PyPI) ships the Kubernetes OpenAPI schemas of every recent version
and validates offline; "strict" also rejects fields the API does not know (a typo in a field
name would otherwise be dropped silently by the API server). No cluster is started here.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.deploy_files import (  # the Dockerfile as the other deployment tests read it
    BENCHMARKS_DOC,
    CONFIG_PATH,
    DEPLOY_DOC,
    ECS_TASK,
    IMAGE_UID,
    K8S_DIR,
    SINK_DIR,
    console_script_name,
    docker_args,
    dockerfile_instructions,
)
from helpers.live_supervisor import LiveSupervisor, running_feed, wait_for
from kubernetes_validate import utils as kubernetes_validate

from supervisor import exit_codes
from supervisor.adapters.http_endpoint import parse_listen
from supervisor.adapters.worker_id import POD_NAME_ENV
from supervisor.cli import main as cli_main
from supervisor.config.loading import load_config

KINDS = {"Deployment", "PodDisruptionBudget", "ServiceAccount", "ConfigMap", "Service"}
# The oldest Kubernetes docs/deploy.md promises (PodDisruptionBudget's
# unhealthyPodEvictionPolicy is GA from 1.31), and the newest the validator ships.
OLDEST_VERSION = "1.31"
VERSIONS = (OLDEST_VERSION, kubernetes_validate.latest_version())
POD_NAME = "shardvisor-6d5f7c9b8-x2k4q"


def manifests() -> dict[str, dict[str, Any]]:
    """{kind: object}; every file holds exactly one object."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S_DIR.glob("*.yaml")):
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert len(documents) == 1, f"{path.name}: {len(documents)} objects, want one per file"
        (obj,) = documents
        assert obj["kind"] not in found, f"two {obj['kind']} objects"
        found[obj["kind"]] = obj
    return found


@pytest.fixture(scope="module")
def k8s() -> dict[str, dict[str, Any]]:
    return manifests()


def pod_spec(k8s: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return k8s["Deployment"]["spec"]["template"]["spec"]


def container(k8s: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (found,) = pod_spec(k8s)["containers"]
    return found


def config_toml(k8s: dict[str, dict[str, Any]]) -> str:
    (key,) = k8s["ConfigMap"]["data"]
    return k8s["ConfigMap"]["data"][key]


@pytest.fixture(scope="module")
def config(k8s, tmp_path_factory):
    """The ConfigMap's file, loaded as `shardvisor run` loads it."""
    path = tmp_path_factory.mktemp("k8s") / Path(CONFIG_PATH).name
    path.write_text(config_toml(k8s))
    return load_config(path)


def container_port(k8s: dict[str, dict[str, Any]], port: int | str) -> int:
    """A probe's or Service's port (a number or a container port's name) as a number."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container(k8s)["ports"] if p["name"] == port]
    return number


def quantity(value: str) -> float:
    """A Kubernetes quantity as used here: CPU ("500m", "2") or bytes ("512Mi", "1Gi")."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(m|Ki|Mi|Gi)?", str(value))
    assert match, f"unsupported quantity {value!r}"
    scale = {None: 1, "m": 0.001, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}[match.group(2)]
    return float(match.group(1)) * scale


# --- the files and the schemas ----------------------------------------------------------------


def test_one_object_per_file_of_each_kind_and_no_namespace(k8s) -> None:
    assert set(k8s) == KINDS
    for obj in k8s.values():
        assert "namespace" not in obj["metadata"], "namespace-agnostic: kubectl -n decides"
        assert obj["metadata"]["labels"] == {"app.kubernetes.io/name": "shardvisor"}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_manifest_matches_the_kubernetes_schema(k8s, kind: str, version: str) -> None:
    assert kubernetes_validate.validate(k8s[kind], version, strict=True)


def test_the_validator_rejects_an_unknown_field(k8s) -> None:
    """The check above would pass on anything if the schemas were not found or not strict."""
    broken = copy.deepcopy(k8s["Deployment"])
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 30  # a typo
    with pytest.raises(kubernetes_validate.ValidationError, match="terminationGracePeriod"):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


# --- the ConfigMap's config -------------------------------------------------------------------


def test_configmap_config_passes_check_config(k8s, tmp_path) -> None:
    path = tmp_path / "shardvisor.toml"
    path.write_text(config_toml(k8s))
    assert cli_main(["check-config", "-c", str(path)]) == exit_codes.OK


def test_configmap_is_mounted_where_the_command_reads_it(k8s) -> None:
    (key,) = k8s["ConfigMap"]["data"]
    assert key == Path(CONFIG_PATH).name
    volumes = {v["name"]: v for v in pod_spec(k8s)["volumes"]}
    (mount,) = [m for m in container(k8s)["volumeMounts"] if "configMap" in volumes[m["name"]]]
    assert mount["mountPath"] == str(Path(CONFIG_PATH).parent)
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["configMap"]["name"] == k8s["ConfigMap"]["metadata"]["name"]


def test_worker_id_comes_from_the_pod_name(k8s, config) -> None:
    assert config.worker.id == ""  # one file for every pod: each names itself
    (env,) = [e for e in container(k8s)["env"] if e["name"] == POD_NAME_ENV]
    assert env["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_resources_are_sized_for_max_shards_from_the_benchmarks(k8s, config) -> None:
    resources = container(k8s)["resources"]
    for name in ("cpu", "memory"):
        assert quantity(resources["requests"][name]) <= quantity(resources["limits"][name])
    text = (K8S_DIR / "deployment.yaml").read_text()
    assert f"Sized for [worker] max_shards = {config.worker.max_shards} " in text
    assert config.worker.max_shards > 0
    benchmarks = BENCHMARKS_DOC.read_text()
    for row, heading in (("row 5", "## 5. Memory per host"), ("row 7", "## 7. Scale on one host")):
        assert row in text and heading in benchmarks, f"deployment.yaml cites {row}: {heading}"


# --- ports, probes, Service -------------------------------------------------------------------


def test_http_listens_where_probes_and_the_service_connect(k8s, config) -> None:
    host, port = parse_listen(config.http.listen)
    assert host in ("0.0.0.0", "::"), "loopback is unreachable for the kubelet and Prometheus"
    c = container(k8s)
    assert [(p["containerPort"], p["protocol"]) for p in c["ports"]] == [(port, "TCP")]
    liveness, readiness = c["livenessProbe"]["httpGet"], c["readinessProbe"]["httpGet"]
    assert (liveness["path"], container_port(k8s, liveness["port"])) == ("/healthz", port)
    assert (readiness["path"], container_port(k8s, readiness["port"])) == ("/readyz", port)
    assert "[http]" in config_toml(k8s) and "NetworkPolicy" in config_toml(k8s)  # why exposed
    (service_port,) = k8s["Service"]["spec"]["ports"]
    assert container_port(k8s, service_port["targetPort"]) == port
    assert service_port["name"] == "metrics"


def test_probes_give_up_later_than_they_time_out(k8s) -> None:
    for probe in (container(k8s)["livenessProbe"], container(k8s)["readinessProbe"]):
        assert probe["timeoutSeconds"] < probe["periodSeconds"]


def test_selectors_and_names_agree(k8s) -> None:
    labels = k8s["Deployment"]["spec"]["template"]["metadata"]["labels"]
    selector = k8s["Deployment"]["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert k8s["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == selector
    assert k8s["Service"]["spec"]["selector"] == selector
    assert pod_spec(k8s)["serviceAccountName"] == k8s["ServiceAccount"]["metadata"]["name"]
    for constraint in pod_spec(k8s)["topologySpreadConstraints"]:
        assert constraint["labelSelector"]["matchLabels"] == selector


def test_metrics_service_is_headless_and_keeps_not_ready_pods(k8s) -> None:
    spec = k8s["Service"]["spec"]
    assert spec["clusterIP"] == "None"
    assert spec["publishNotReadyAddresses"] is True


# --- image, command, security -----------------------------------------------------------------


def test_image_and_arguments_are_the_dockerfiles(k8s) -> None:
    c = container(k8s)
    instructions = dockerfile_instructions()
    assert "command" not in c, "keep the image's ENTRYPOINT: tini as PID 1 forwards SIGTERM"
    assert docker_args(instructions, "ENTRYPOINT")[-1].endswith(f'"{console_script_name()}"]')
    assert c["args"] == yaml.safe_load(docker_args(instructions, "CMD")[-1])
    assert c["args"] == ["run", "-c", CONFIG_PATH]
    ecs_image = json.loads(ECS_TASK.read_text())["containerDefinitions"][0]["image"]
    assert c["image"] == ecs_image
    assert c["workingDir"] == docker_args(instructions, "WORKDIR")[-1] == SINK_DIR


def test_non_root_read_only_root_and_writable_scratch(k8s, config) -> None:
    pod, c = pod_spec(k8s), container(k8s)
    uid = docker_args(dockerfile_instructions(), "USER")[-1].split(":")[0]
    assert uid == IMAGE_UID
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert str(pod["securityContext"]["runAsUser"]) == IMAGE_UID
    assert str(pod["securityContext"]["fsGroup"]) == IMAGE_UID
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = c["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    writable = {
        m["mountPath"]
        for m in c["volumeMounts"]
        if not m.get("readOnly") and "emptyDir" in volumes[m["name"]]
    }
    assert writable == {c["workingDir"], "/tmp"}
    # Every file the supervisor writes is relative to the working directory (an emptyDir).
    assert config.sink.kind == "jsonl"
    for path in (config.sink.path, config.dead_letter.path):
        assert not path.startswith("/"), path
    for name in writable:
        (volume,) = [volumes[m["name"]] for m in c["volumeMounts"] if m["mountPath"] == name]
        assert quantity(volume["emptyDir"]["sizeLimit"]) > 0  # bounded: evicted, not a full disk


# --- rollouts, SIGTERM, disruptions, IAM ------------------------------------------------------


def test_grace_period_outlasts_the_drain(k8s, config) -> None:
    grace = pod_spec(k8s)["terminationGracePeriodSeconds"]
    assert grace >= config.supervisor.shutdown_timeout + 5
    assert "lifecycle" not in container(k8s), "no preStop: it would only delay the hand-off"


def test_rollout_surges_before_it_stops_anyone(k8s) -> None:
    spec = k8s["Deployment"]["spec"]
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert spec["replicas"] >= 2
    pdb = k8s["PodDisruptionBudget"]["spec"]
    assert pdb["maxUnavailable"] == 1
    assert pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_service_account_names_an_iam_role_and_the_doc_its_trust(k8s) -> None:
    name = k8s["ServiceAccount"]["metadata"]["name"]
    role = k8s["ServiceAccount"]["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    assert re.fullmatch(r"arn:aws:iam::<account>:role/[\w+=,.@-]+", role), role
    doc = DEPLOY_DOC.read_text()
    (trust,) = [
        json.loads(block)
        for block in re.findall(r"```json\n(.*?)```", doc, flags=re.S)
        if "AssumeRoleWithWebIdentity" in block
    ]
    (statement,) = trust["Statement"]
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert ":oidc-provider/oidc.eks." in statement["Principal"]["Federated"]
    conditions = statement["Condition"]["StringEquals"]
    assert f"system:serviceaccount:<namespace>:{name}" in conditions.values()
    assert "sts.amazonaws.com" in conditions.values()
    assert role.rsplit("/", 1)[1] in doc
    assert "[`docs/iam-policy.json`](iam-policy.json)" in doc
    for path in sorted(K8S_DIR.glob("*.yaml")):
        assert f"conf/kubernetes/{path.name}" in doc, f"docs/deploy.md does not list {path.name}"


# --- the ConfigMap's config, run as a pod runs it ---------------------------------------------


@pytest.mark.slow
def test_supervisor_runs_the_configmap_config_as_a_pod_does(k8s, tmp_path, dynalite_server):
    """Only what cannot exist here is replaced (DynamoDB's endpoint, the feeds' URLs, the port:
    several tests share this host); the id comes from POD_NAME, the probes' paths answer, the
    files land under the working directory, and SIGTERM drains to exit 0 within the grace."""
    data = tomllib.loads(config_toml(k8s))
    assert data["http"]["listen"].endswith(":9400")
    data["http"]["listen"] = "127.0.0.1:0"
    data["dynamodb"]["endpoint_url"] = dynalite_server.url
    data["dynamodb"]["table"] = "k8s-" + uuid.uuid4().hex[:12]
    c = container(k8s)
    grace = pod_spec(k8s)["terminationGracePeriodSeconds"]
    with running_feed(tmp_path, rate=50.0) as feed_url:
        for shard in data["shards"]:
            for stream in shard["streams"]:
                stream["url"] = f"{feed_url}/{stream['id']}?after={{after}}"
        supervisor = LiveSupervisor(tmp_path, data, env={POD_NAME_ENV: POD_NAME})
        try:
            supervisor.wait_status(c["readinessProbe"]["httpGet"]["path"], 200)
            assert supervisor.get(c["livenessProbe"]["httpGet"]["path"])[0] == 200
            status = supervisor.status_json()
            assert [w["id"] for w in status["workers"]] == [POD_NAME]
            assert {s["owner"] for s in status["shards"]} == {POD_NAME}
            for shard in data["shards"]:  # the sink's relative path: the working directory
                for stream in shard["streams"]:
                    pattern = f"{shard['id']}/{stream['id']}.*.jsonl"
                    wait_for(lambda p=pattern: list((tmp_path / "out").glob(p)), 20, pattern)
        finally:
            code = supervisor.stop(timeout=grace)
    assert code == exit_codes.OK, supervisor.log()
    after = supervisor.status_json()
    assert [w["state"] for w in after["workers"]] == ["stopped"]
    assert {s["owner"] for s in after["shards"]} == {None}  # released, not left to expire
