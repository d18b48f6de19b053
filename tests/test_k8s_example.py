"""jobs/examples/k8s-daskjob.yaml (docs/cluster.md, "Kubernetes"): a Dask Kubernetes Operator ``DaskJob`` whose job
pod runs ``memtrain train ... --cluster "$DASK_SCHEDULER_ADDRESS"``, with one ReadWriteMany volume mounted at the
same path in the job pod and every worker. Checked as YAML here (no Kubernetes in this project's CI)."""

from __future__ import annotations

from pathlib import Path

import yaml

EXAMPLE = Path(__file__).resolve().parent.parent / "jobs" / "examples" / "k8s-daskjob.yaml"


def documents() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(EXAMPLE.read_text()) if doc}


def test_the_daskjob_runs_memtrain_on_the_operators_scheduler_with_a_shared_rwx_volume() -> None:
    docs = documents()
    assert set(docs) == {"PersistentVolumeClaim", "DaskJob"}
    claim = docs["PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    job = docs["DaskJob"]
    assert job["apiVersion"] == "kubernetes.dask.org/v1"
    pod = job["spec"]["job"]["spec"]
    (container,) = pod["containers"]
    command = " ".join(container["command"] + container["args"])
    assert "memtrain train" in command and '--cluster "$DASK_SCHEDULER_ADDRESS"' in command
    assert "memtrain train --resume /shared/runs/softmax" in command  # a resubmitted job resumes
    workers = job["spec"]["cluster"]["spec"]["worker"]
    assert workers["spec"]["containers"][0]["args"][:2] == ["dask", "worker"]
    assert "--nthreads" in workers["spec"]["containers"][0]["args"]
    for spec, one in ((pod, container), (workers["spec"], workers["spec"]["containers"][0])):
        (volume,) = spec["volumes"]
        assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        assert one["volumeMounts"] == [{"name": volume["name"], "mountPath": "/shared"}]
    assert job["spec"]["cluster"]["spec"]["scheduler"]["spec"]["containers"][0]["args"] == ["dask", "scheduler"]
