"""Pod Security admission, as the API server enforces it on pod creation.

A namespace labelled pod-security.kubernetes.io/enforce=baseline or
=restricted refuses pods that violate that level (403 Forbidden, "violates
PodSecurity ..."), checking the controls of the Pod Security Standards
(latest) that concern the fields a pod of ours can carry:

  baseline    host namespaces (hostNetwork, hostPID, hostIPC), privileged
              containers, capabilities beyond the default set, hostPath
              volumes, host ports, seccomp Unconfined
  restricted  the above, and: volume types (configMap, csi, downwardAPI,
              emptyDir, ephemeral, persistentVolumeClaim, projected, secret),
              allowPrivilegeEscalation=false, runAsNonRoot=true (pod or every
              container), runAsUser != 0, seccompProfile RuntimeDefault or
              Localhost (pod or every container), capabilities drop ALL and
              add at most NET_BIND_SERVICE

Every container is checked: init containers and sidecars too. AppArmor,
SELinux, /proc mount types, sysctls and Windows pods are not checked here.
"""

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def _containers(spec):
    return [c for key in ("initContainers", "containers") for c in (spec.get(key) or [])]


def _names(containers):
    return ", ".join('"%s"' % c.get("name", "") for c in containers)


def violations(pod, level):
    """The violated controls of `level` ("baseline" or "restricted"), as the API server words them."""
    spec = pod.get("spec") or {}
    pod_sc = spec.get("securityContext") or {}
    containers = _containers(spec)
    out = []

    host = [f for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]
    if host:
        out.append("host namespaces (%s)" % ", ".join("%s=true" % f for f in host))
    privileged = [c for c in containers if (c.get("securityContext") or {}).get("privileged")]
    if privileged:
        out.append("privileged (container%s %s must not set securityContext.privileged=true)"
                   % ("s" if len(privileged) > 1 else "", _names(privileged)))
    added = {}
    for c in containers:
        caps = ((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
        extra = [cap for cap in caps if cap not in BASELINE_CAPABILITIES]
        if extra:
            added[c.get("name", "")] = extra
    if added:
        out.append("non-default capabilities (%s)" % "; ".join(
            'container "%s" must not include %s in securityContext.capabilities.add' % (n, ", ".join(caps))
            for n, caps in added.items()))
    host_path = [v.get("name", "") for v in spec.get("volumes") or [] if "hostPath" in v]
    if host_path:
        out.append("hostPath volumes (volume%s %s)" % ("s" if len(host_path) > 1 else "",
                                                      ", ".join('"%s"' % v for v in host_path)))
    ports = [c for c in containers if any(p.get("hostPort") for p in c.get("ports") or [])]
    if ports:
        out.append("hostPort (container%s %s use%s hostPort)" % ("s" if len(ports) > 1 else "", _names(ports),
                                                               "" if len(ports) > 1 else "s"))
    unconfined = [c for c in containers
                  if ((c.get("securityContext") or {}).get("seccompProfile") or {}).get("type") == "Unconfined"]
    if (pod_sc.get("seccompProfile") or {}).get("type") == "Unconfined" or unconfined:
        out.append("seccompProfile (pod or containers must not set securityContext.seccompProfile.type to "
                   "\"Unconfined\")")
    if level == "baseline":
        return out

    bad_volumes = [v.get("name", "") for v in spec.get("volumes") or []
                   if not any(k in RESTRICTED_VOLUMES for k in v if k != "name")]
    if bad_volumes:
        out.append("restricted volume types (volume%s %s)" % ("s" if len(bad_volumes) > 1 else "",
                                                              ", ".join('"%s"' % v for v in bad_volumes)))
    escalation = [c for c in containers if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False]
    if escalation:
        out.append("allowPrivilegeEscalation != false (container%s %s must set "
                   "securityContext.allowPrivilegeEscalation=false)" % ("s" if len(escalation) > 1 else "",
                                                                        _names(escalation)))
    caps_bad = []
    for c in containers:
        caps = (c.get("securityContext") or {}).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []) or any(a != "NET_BIND_SERVICE" for a in caps.get("add") or []):
            caps_bad.append(c)
    if caps_bad:
        out.append('unrestricted capabilities (container%s %s must set securityContext.capabilities.drop=["ALL"])'
                   % ("s" if len(caps_bad) > 1 else "", _names(caps_bad)))

    def effective(c, key):
        sc = c.get("securityContext") or {}
        return sc[key] if key in sc else pod_sc.get(key)
    non_root = [c for c in containers if effective(c, "runAsNonRoot") is not True]
    if non_root:
        out.append("runAsNonRoot != true (pod or container%s %s must set securityContext.runAsNonRoot=true)"
                   % ("s" if len(non_root) > 1 else "", _names(non_root)))
    root = [c for c in containers if effective(c, "runAsUser") == 0]
    if root:
        out.append("runAsUser=0 (container%s %s must not set runAsUser=0)" % ("s" if len(root) > 1 else "",
                                                                            _names(root)))
    no_seccomp = [c for c in containers
                  if ((effective(c, "seccompProfile") or {}).get("type")) not in ("RuntimeDefault", "Localhost")]
    if no_seccomp:
        out.append('seccompProfile (pod or container%s %s must set securityContext.seccompProfile.type to '
                   '"RuntimeDefault" or "Localhost")' % ("s" if len(no_seccomp) > 1 else "", _names(no_seccomp)))
    return out


def admit(store, ns, pod):
    """None, or the Forbidden message for a pod the namespace's enforced level refuses."""
    with store.lock:
        namespace = store.get_raw("/namespaces", "", ns)
    if namespace is None:
        return None
    level = ((namespace.get("metadata") or {}).get("labels") or {}).get(ENFORCE_LABEL)
    if level not in ("baseline", "restricted"):
        return None
    found = violations(pod, level)
    if not found:
        return None
    name = (pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get("generateName", "")
    return 'pods "%s" is forbidden: violates PodSecurity "%s:latest": %s' % (name, level, ", ".join(found))
