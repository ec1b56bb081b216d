"""Names we own: API coordinates, labels, and the launcher's paths."""

GROUP = "torchrun.dev"
VERSION = "v1alpha1"
KIND = "DistributedTrainingJob"
PLURAL = "distributedtrainingjobs"

JOB_LABEL = f"{GROUP}/job-name"
NODE_RANK_LABEL = f"{GROUP}/node-rank"
ATTEMPT_LABEL = f"{GROUP}/attempt"
