"""A small real multi-node Ray cluster on this machine for the Ray Data tests (`ray.cluster_utils.Cluster`, CPU only,
small object stores), a TranscribeBatch that marks each batch it starts, so a test can kill its node mid-job, and the
comparison of results computed in differently composed batches."""
import math
import os
import sys
import time
import uuid

from seq2seq_engine.integrations.ray_data import TranscribeBatch

OBJECT_STORE_BYTES = 100 * 1024 * 1024
WORKER_NODES = 3  # one CPU each: two replicas and a spare CPU for the replica restarted after a node dies


def start_cluster():
    """(cluster, address): a head node with no CPUs (the driver's node) and WORKER_NODES one-CPU worker nodes,
    with this process connected as the driver."""
    import ray
    import ray.cloudpickle
    from ray.cluster_utils import Cluster

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # replicas cannot import the tests/ modules
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage reports: they query a missing Prometheus
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                            "object_store_memory": OBJECT_STORE_BYTES})
    for _ in range(WORKER_NODES):
        cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE_BYTES)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    return cluster, cluster.address


def stop_cluster(cluster) -> None:
    import ray

    ray.shutdown()
    cluster.shutdown()


class MarkedTranscribeBatch(TranscribeBatch):
    """TranscribeBatch that writes `<marks>/<node id>-<uuid>` when it starts a batch, then waits `pause_s` seconds
    before transcribing, so the batch is still running when a test acts on the mark."""

    def __init__(self, config, marks: str, pause_s: float) -> None:
        super().__init__(config)
        self.marks, self.pause_s = marks, pause_s

    def __call__(self, batch):
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        with open(os.path.join(self.marks, f"{node_id}-{uuid.uuid4().hex}"), "w", encoding="utf-8"):
            pass
        time.sleep(self.pause_s)
        return super().__call__(batch)


def node_of_first_mark(marks: str, timeout_s: float) -> str:
    """The node id in the first mark written to `marks` (waiting up to `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        names = os.listdir(marks)
        if names:
            return names[0].rsplit("-", 1)[0]
        time.sleep(0.1)
    raise TimeoutError(f"no batch started within {timeout_s} s")


def same_but_float_rounding(left, right, rel: float = 1e-5) -> bool:
    """Equal nested dicts/lists, floats equal up to `rel`: a replica's continuous batch holds other requests than
    the single-machine run's, and float32 sums over a batch of another shape differ in the last bits (decoding
    scores such as avg_logprob); texts, tokens and timestamps must be equal."""
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(same_but_float_rounding(left[k], right[k], rel) for k in left)
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        return len(left) == len(right) and all(same_but_float_rounding(a, b, rel) for a, b in zip(left, right))
    if isinstance(left, float) and isinstance(right, float):
        return math.isclose(left, right, rel_tol=rel, abs_tol=rel)
    return left == right
