"""Kubeflow training-operator v1.9.3's published PyTorchJob examples (examples/pytorch), read
in place from the Go module cache: `cluster/build.sh all` downloads the module to build the
benchmarks' training-operator, and `go mod download` fetches it here if it is missing. They
are never copied into this repository."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from localkube import gomod

MODULE = "github.com/kubeflow/training-operator"
VERSION = "v1.9.3"
# Our name for each example -> its path under examples/pytorch.
EXAMPLES = {
    "cpu-demo-demo.yaml": "cpu-demo/demo.yaml",
    "deepspeed-demo-pytorch_deepspeed_demo.yaml": "deepspeed-demo/pytorch_deepspeed_demo.yaml",
    "elastic-echo-echo.yaml": "elastic/echo/echo.yaml",
    "elastic-imagenet-imagenet.yaml": "elastic/imagenet/imagenet.yaml",
    "mnist-pytorch_job_mnist_gloo.yaml": "mnist/v1/pytorch_job_mnist_gloo.yaml",
    "mnist-pytorch_job_mnist_mpi.yaml": "mnist/v1/pytorch_job_mnist_mpi.yaml",
    "mnist-pytorch_job_mnist_nccl.yaml": "mnist/v1/pytorch_job_mnist_nccl.yaml",
    "simple.yaml": "simple.yaml",
    "smoke-dist-pytorch_job_sendrecv.yaml": "smoke-dist/pytorch_job_sendrecv.yaml",
}
SCRIPTS = {"cpu-demo-demo.py": "cpu-demo/demo.py"}


@cache
def examples_dir() -> Path:
    return gomod.module_dir(MODULE, VERSION) / "examples" / "pytorch"


def example(name: str) -> Path:
    """The example (or its script) by our name."""
    return examples_dir() / (EXAMPLES.get(name) or SCRIPTS[name])
