"""The one vocabulary of machine-readable reasons NodeWright gives for a node.

Every ``Reason.code`` a service writes into its record, and every reason the status service
shows in ``status.nodeDetails[].reason`` and the node condition ``nodewright.nvidia.com/<cr>`` is
one of the constants here, grouped by who produces it. Codes are stable CamelCase
identifiers: tools match on them, so a code is never renamed, only added (docs/api.md lists
them with their meaning and the way out).

Not this module's job: the messages (each producer writes its own, naming what is in the
way), the CR condition types (``shared.api.ConditionType``) and the reasons of Kubernetes
Events (``services.status.kube_events``).
"""

from __future__ import annotations

from typing import Final

# ---- why a target node is not admitted (the rollout kernel, ``shared.rollout``) ----------

NODE_STATE_MALFORMED: Final = "NodeStateMalformed"
"""A NodeWright annotation on the node does not decode (Blocked; ``nodewright node reset``)."""
NODE_IGNORED: Final = "NodeIgnored"
"""The node is labelled ``nodewright.nvidia.com/ignore=true`` (Blocked)."""
TAINT_NOT_TOLERATED: Final = "TaintNotTolerated"
"""The node has taints ``spec.additionalTolerations`` does not tolerate (Blocked)."""
POLICY_NOT_FOUND: Final = "DeploymentPolicyNotFound"
"""The NodeWright names a DeploymentPolicy that does not exist (Blocked)."""
DISABLED: Final = "Disabled"
PAUSED: Final = "Paused"
NODE_NOT_READY: Final = "NodeNotReady"
"""Not admitted while NotReady; also the validator's reason while a node waits to be Ready
again after its packages."""
WAITING_FOR_PRIORITY: Final = "WaitingForPriority"
WAITING_FOR_WINDOW: Final = "WaitingForWindow"
COMPARTMENT_STOPPED: Final = "CompartmentStopped"
BUDGET_EXHAUSTED: Final = "BudgetExhausted"
CLUSTER_BUDGET_EXHAUSTED: Final = "ClusterBudgetExhausted"
SHARED_BUDGET_EXHAUSTED: Final = "SharedBudgetExhausted"
WAITING_FOR_BATCH: Final = "WaitingForBatch"
BATCH_SOAKING: Final = "BatchSoaking"
"""The compartment's last batch finished less than ``batchSoakSeconds`` ago: the next one
opens once it has soaked (``details.until``)."""
BATCH_AWAITING_APPROVAL: Final = "BatchAwaitingApproval"
"""The compartment's last batch is one its policy gates (``approvalAfterBatches``): the next
one opens once a person approved it (``nodewright approve``; ``details.batch``,
``details.command``)."""
ADMITTING: Final = "Admitting"
"""Due: the scheduler's decision admits the node, and writes the admission next."""

BLOCKING: Final = frozenset(
    {NODE_STATE_MALFORMED, NODE_IGNORED, TAINT_NOT_TOLERATED, POLICY_NOT_FOUND}
)
"""Reasons that make a node not admitted Blocked; the other admission reasons make it
Waiting."""

COMPARTMENT_WAITS: Final = (
    DISABLED,
    PAUSED,
    WAITING_FOR_PRIORITY,
    WAITING_FOR_WINDOW,
    BATCH_SOAKING,
    BATCH_AWAITING_APPROVAL,
    BUDGET_EXHAUSTED,
    CLUSTER_BUDGET_EXHAUSTED,
    SHARED_BUDGET_EXHAUSTED,
)
"""Why a compartment starts nothing although nodes wait for it, the first that holds
winning. A stop has its own fields (CompartmentStopped); waiting for the batch in flight is
the normal course of a rollout and is no reason; a NotReady node holds back only itself."""

STOPPED_AFTER_FAILED_BATCHES: Final = "FailedBatchesLimit"
"""``status.compartments[].batch.stopReason`` of a compartment stopped by its failure gate."""

# ---- admitted, between the services (the status service, from the records) --------------

ADMITTED: Final = "Admitted"
UNCORDONING: Final = "Uncordoning"
RELEASING: Final = "Releasing"
VALIDATING: Final = "Validating"
WAITING_FOR_CHECK: Final = "WaitingForCheck"
STAGE_PENDING: Final = "StagePending"
STAGE_RUNNING: Final = "StageRunning"
INTERRUPTING: Final = "Interrupting"
REBOOTING: Final = "Rebooting"
COMPLETE: Final = "Complete"
NOT_TARGETED: Final = "NotTargeted"
"""Not selected by ``spec.nodeSelectors`` (the node only carries records of the NodeWright)."""

# ---- the drainer ----------------------------------------------------------------------

WAITING_FOR_PROTECTED_PODS: Final = "WaitingForProtectedPods"
"""The drain waits for pods matching ``podNonInterruptLabels`` (a record without a reason)."""
PROTECTED_POD_RUNNING: Final = "ProtectedPodRunning"
PROTECTED_POD_TIMEOUT: Final = "ProtectedPodTimeout"
IMAGES_PULLING: Final = "ImagesPulling"
"""With ``spec.drain.prePullImages``: the drain waits until the package images are on the
node (the message names them and the pod pulling them)."""
DRAINING: Final = "Draining"
DRAIN_BLOCKED: Final = "DrainBlocked"
"""Evictions are refused and the record names no more precise reason."""
PDB_BLOCKING: Final = "PodDisruptionBudgetBlocking"
MULTIPLE_PDBS: Final = "MultiplePodDisruptionBudgets"
EVICTION_REFUSED: Final = "EvictionRefused"
UNMANAGED_POD: Final = "UnmanagedPod"
EMPTY_DIR_DATA: Final = "EmptyDirData"
DAEMON_SET_POD: Final = "DaemonSetPod"
DRAIN_TIMEOUT: Final = "DrainTimeout"
DRAIN_FAILED: Final = "DrainFailed"
"""A failed drain record without a reason of its own."""

# ---- the executor ---------------------------------------------------------------------

STAGE_FAILED: Final = "StageFailed"
STAGE_TIMEOUT: Final = "StageTimeout"
STAGE_ABORTED: Final = "StageAborted"
"""Someone stopped the running stage (``nodewright node abort``); its pod is kept, stopped,
for its logs; ``nodewright node retry`` runs it again."""
IMAGE_PULL_FAILED: Final = "ImagePullFailed"
IMAGE_VOLUME_UNSUPPORTED: Final = "ImageVolumeUnsupported"
"""The node's container runtime cannot mount the package image as an image volume; the
message names the setting that avoids them (``packageStaging: copy``)."""
CONTAINER_CREATE_FAILED: Final = "ContainerCreateFailed"
"""The runtime could not create a stage (or check) container for the image-pull grace period."""
INTERRUPT_FAILED: Final = "InterruptFailed"
INTERRUPT_TIMEOUT: Final = "InterruptTimeout"
REBOOT_TIMEOUT: Final = "RebootTimeout"

# ---- the validator --------------------------------------------------------------------

CHECK_FAILED: Final = "CheckFailed"
CHECK_TIMEOUT: Final = "CheckTimeout"

FAILED: Final = "Failed"
"""A failed record that carries no reason (written by an older version)."""
