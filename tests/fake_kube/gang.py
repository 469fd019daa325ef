"""Gang schedulers, as far as the operator meets them.

--gang-scheduler NAME (repeatable) serves that scheduler's API group, so
discovery shows it installed, and plays its part in placing pods:

  volcano            scheduling.volcano.sh/v1beta1 podgroups. A pod with
                     schedulerName "volcano" names its group in the
                     scheduling.k8s.io/group-name annotation; it is placed only
                     once the group exists and at least its spec.minMember
                     pods are waiting or placed (then all of them are).
  scheduler-plugins  scheduling.x-k8s.io/v1alpha1 podgroups (coscheduling).
                     A pod of schedulerName "scheduler-plugins-scheduler" names
                     its group in the scheduling.x-k8s.io/pod-group label; the
                     same minMember rule.
  kueue              kueue.x-k8s.io/v1beta1 workloads, localqueues,
                     clusterqueues. Kueue's plain-pod groups: pods labelled
                     kueue.x-k8s.io/pod-group-name, with the group's size in
                     the kueue.x-k8s.io/pod-group-total-count annotation and
                     the kueue.x-k8s.io/admission scheduling gate. Once every
                     pod of a group exists and the LocalQueue their
                     kueue.x-k8s.io/queue-name label names exists in their
                     namespace, a Workload for the group is created admitted
                     and the gates are lifted, all pods at once; until then
                     they wait gated. (Quotas and the finalizer Kueue puts on
                     its pods are not played.)

A pod for a gang scheduler the server does not play (its API not served)
waits Pending, as it would where no such scheduler runs.
"""

from registry import ResourceType

GANG_TYPES = {
    "volcano": lambda: [
        ResourceType("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup", True,
                     short_names=["pg", "podgroup-v1beta1"], status=True)],
    "scheduler-plugins": lambda: [
        ResourceType("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup", True,
                     short_names=["pg", "pgs"], status=True)],
    "kueue": lambda: [
        ResourceType("kueue.x-k8s.io", "v1beta1", "workloads", "Workload", True, short_names=["wl"], status=True),
        ResourceType("kueue.x-k8s.io", "v1beta1", "localqueues", "LocalQueue", True,
                     short_names=["queue", "queues", "lq"], status=True),
        ResourceType("kueue.x-k8s.io", "v1beta1", "clusterqueues", "ClusterQueue", False,
                     short_names=["cq"], status=True)],
}

# schedulerName -> (scheduler, storage key of its PodGroups, where pods name their group)
POD_GROUP_SCHEDULERS = {
    "volcano": ("volcano", "scheduling.volcano.sh/podgroups", ("annotations", "scheduling.k8s.io/group-name")),
    "scheduler-plugins-scheduler": ("scheduler-plugins", "scheduling.x-k8s.io/podgroups",
                                    ("labels", "scheduling.x-k8s.io/pod-group")),
}
KUEUE_GATE = "kueue.x-k8s.io/admission"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"


def register(registry, names):
    for name in names:
        if name not in GANG_TYPES:
            raise ValueError("--gang-scheduler %s: not one of %s" % (name, ", ".join(sorted(GANG_TYPES))))
        for t in GANG_TYPES[name]():
            registry.add(t)


def _live(pod):
    return not pod["metadata"].get("deletionTimestamp") and \
        (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


class GangSchedulers:
    """The schedulers' decisions, taken in the kubelet's sync pass."""

    def __init__(self, store, names):
        self.store = store
        self.names = set(names)

    def may_place(self, pod, pods):
        """(True, "") when the pod may be placed now, else (False, why)."""
        scheduler_name = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
        entry = POD_GROUP_SCHEDULERS.get(scheduler_name)
        if entry is None:
            return True, ""
        scheduler, skey, (where, key) = entry
        if scheduler not in self.names:
            return False, "no scheduler named %s runs in this cluster" % scheduler_name
        meta = pod["metadata"]
        ns = meta.get("namespace")
        group_name = (meta.get(where) or {}).get(key)
        if not group_name:
            return False, "%s pod without a group (%s %s)" % (scheduler, where[:-1], key)
        group = self.store.get_raw(skey, ns, group_name)
        if group is None:
            return False, "pod group %s does not exist" % group_name
        min_member = int((group.get("spec") or {}).get("minMember") or 1)
        members = [p for p in pods if p["metadata"].get("namespace") == ns and _live(p) and
                   ((p["metadata"].get(where) or {}).get(key)) == group_name]
        if len(members) < min_member:
            return False, "pod group %s has %d of its minMember %d pods" % (group_name, len(members), min_member)
        return True, ""

    def admit_kueue_groups(self, pods):
        """Kueue's admission of complete plain-pod groups: a Workload, then the gates lifted."""
        if "kueue" not in self.names:
            return
        groups = {}
        for p in pods:
            meta = p["metadata"]
            group = (meta.get("labels") or {}).get(KUEUE_GROUP_LABEL)
            if group and _live(p):
                groups.setdefault((meta.get("namespace"), group), []).append(p)
        for (ns, group), members in sorted(groups.items()):
            gated = [p for p in members if any(g.get("name") == KUEUE_GATE
                                               for g in (p.get("spec") or {}).get("schedulingGates") or [])]
            if not gated:
                continue
            try:
                total = int((gated[0]["metadata"].get("annotations") or {}).get(KUEUE_COUNT_ANNOTATION, "1"))
            except ValueError:
                continue
            queue = (gated[0]["metadata"].get("labels") or {}).get(KUEUE_QUEUE_LABEL)
            if len(members) < total or not queue or \
                    self.store.get_raw("kueue.x-k8s.io/localqueues", ns, queue) is None:
                continue
            self._admit(ns, group, queue, members, gated)

    def _admit(self, ns, group, queue, members, gated):
        registry = self.store.registry
        wl_type = registry.lookup("kueue.x-k8s.io", "v1beta1", "workloads")
        if self.store.get_raw(wl_type.skey, ns, group) is None:
            workload = {
                "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
                "metadata": {"name": group, "namespace": ns,
                             "labels": {KUEUE_GROUP_LABEL: group}},
                "spec": {"queueName": queue,
                         "podSets": [{"name": "main", "count": len(members),
                                      "template": {"spec": (members[0].get("spec") or {})}}]},
                "status": {"conditions": [{"type": "Admitted", "status": "True", "reason": "Admitted",
                                           "message": "the group's %d pods were admitted together" % len(members)}]},
            }
            try:
                self.store.create(wl_type, ns, workload)
            except Exception:
                pass  # made by an earlier pass
        for p in gated:
            meta = p["metadata"]

            def lift(obj):
                spec = obj.setdefault("spec", {})
                gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != KUEUE_GATE]
                if gates:
                    spec["schedulingGates"] = gates
                else:
                    spec.pop("schedulingGates", None)
                return obj
            self.store.mutate("/pods", meta.get("namespace"), meta["name"], lift, meta["uid"])
