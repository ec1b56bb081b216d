"""kubectl dtj convert: a Kubeflow PyTorchJob (kubeflow.org/v1) as a DistributedTrainingJob.

    kubectl dtj convert -f pytorchjob.yaml > job.yaml     (or from stdin: -f - or no -f)

Prints the equivalent DistributedTrainingJob YAML on stdout and, on stderr, a warning for
every field it cannot carry over or whose meaning changes: nothing is dropped silently. The
mapping and its reasons are in docs/migrating.md; in short:

- Master + Worker replicas -> nodes; the Master's pod template (the Worker's without a
  Master) -> template, warning where the Worker's differs;
- nprocPerNode (or elasticPolicy.nProcPerNode, or the command's --nproc-per-node) ->
  nprocPerNode, "auto" -> "gpu" with a GPU limit; a command without torchrun ran one process
  per pod, and still does (nprocPerNode: 1);
- elasticPolicy: minReplicas/maxReplicas -> elastic.minNodes/maxNodes, maxRestarts ->
  torchrun.maxRestarts, rdzvPort -> rendezvous.port, rdzvConf join_timeout ->
  rendezvous.joinTimeoutSeconds;
- runPolicy: cleanPodPolicy None -> KeepAll, All -> Delete, Running -> KeepFailed;
  ttlSecondsAfterFinished, activeDeadlineSeconds and suspend as they are; backoffLimit ->
  failurePolicy.maxRestarts;
- restartPolicy: ExitCode is this operator's own rule (exit 1-127 fails the job, 128-255 and
  signals restart it); OnFailure and Always restarted on any failure, which here only
  infrastructure failures do (a warning says so); Never -> failurePolicy.maxRestarts: 0;
- runPolicy.schedulingPolicy -> spec.scheduling where a field only one gang scheduler reads
  says which (queue: Volcano; scheduleTimeoutSeconds: Coscheduling), priorityClass -> the
  template's priorityClassName;
- a launcher in the command stays (the operator unwraps it), less the flags the spec now says.

The pieces: load.py reads the untrusted input within bounds; parse.py checks the type of every
field the mapping reads; mapping.py (the job's shape, the command, nprocPerNode) and
policies.py (elasticPolicy, runPolicy, restartPolicy, schedulingPolicy) map it, saying what
does not carry over into a Conversion (result.py); command.py is the command line.
"""

from .command import add_parser, run
from .load import MAX_DEPTH, MAX_INPUT_BYTES, MAX_VALUES, documents
from .mapping import KUBEFLOW_API_VERSION, PYTORCHJOB, TODO_COMMAND, convert
from .result import Conversion, ConvertError, validate

__all__ = [
    "KUBEFLOW_API_VERSION",
    "MAX_DEPTH",
    "MAX_INPUT_BYTES",
    "MAX_VALUES",
    "PYTORCHJOB",
    "TODO_COMMAND",
    "Conversion",
    "ConvertError",
    "add_parser",
    "convert",
    "documents",
    "run",
    "validate",
]
