// Jobs for the operator job tests: a small valid PatrickStarJob, and one with
// every optional field set.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "operator/job/job_spec.h"

namespace pstar::op::test {

// A valid job: the tiny model on the CPU, two pods of two ranks.
inline Json MinimalJob(const std::string& name = "demo") {
  return Json::parse(R"({
    "apiVersion": "patrickstar.io/v1alpha1",
    "kind": "PatrickStarJob",
    "metadata": {"name": ")" + name + R"(", "namespace": "ml", "uid": "0f1e2d3c-aaaa-bbbb-cccc-000000000001",
                 "generation": 3},
    "spec": {
      "numNodes": 2,
      "nprocPerNode": 2,
      "device": "cpu",
      "config": {"model": {"preset": "tiny"}, "train": {"batch_size": 4, "seq_len": 64, "steps": 10}}
    }
  })");
}

// A cuda job with every spec field set (each override in use).
inline Json FullJob() {
  return Json::parse(R"({
    "apiVersion": "patrickstar.io/v1alpha1",
    "kind": "PatrickStarJob",
    "metadata": {"name": "full", "namespace": "research", "uid": "11111111-2222-3333-4444-555555555555",
                 "generation": 7},
    "spec": {
      "numNodes": 3,
      "nprocPerNode": 4,
      "device": "cuda",
      "image": "registry.example.com/pstar-worker:dev",
      "imagePullPolicy": "IfNotPresent",
      "config": {"model": {"preset": "gpt2-124m"},
                 "optimizer": {"type": "AdamW", "params": {"lr": 0.0003, "betas": [0.9, 0.95], "eps": 1e-8}},
                 "train": {"batch_size": 2, "seq_len": 256, "steps": 100, "activation_checkpointing": true},
                 "checkpoint": {"dir": "/ckpt/full", "every_steps": 50}},
      "masterPort": 23456,
      "metricsPort": 9500,
      "exportDir": "/ckpt/full-hf",
      "nccl": {"socketIfname": "eth0", "ibDisable": true, "debug": "WARN",
               "env": {"NCCL_P2P_DISABLE": "1", "NCCL_ALGO": "Ring"}},
      "hostMemory": {"request": "40Gi", "limit": "48Gi", "headroomPercent": 25, "shmSize": "2Gi"},
      "diskTier": {"volume": "nvme", "mountPath": "/nvme", "size": "2Ti"},
      "runPolicy": {"backoffLimit": 5, "activeDeadlineSeconds": 86400, "ttlSecondsAfterFinished": 600,
                    "cleanPodPolicy": "All", "suspend": false, "restartPolicy": "OnFailure",
                    "permanentExitCodes": [2, 3, 127],
                    "schedulingPolicy": {"priorityClass": "high", "queue": "research-gpu", "minAvailable": 2}},
      "env": [{"name": "HF_HOME", "value": "/cache/hf"},
              {"name": "RUN_ID", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}}}],
      "template": {
        "metadata": {"labels": {"team": "nlp", "app.kubernetes.io/name": "mine"},
                     "annotations": {"example.com/owner": "alice"}},
        "spec": {
          "nodeSelector": {"gpu": "a100"},
          "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
          "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
              {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}},
          "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt-pvc"}},
                      {"name": "cache", "emptyDir": {}},
                      {"name": "nvme", "hostPath": {"path": "/mnt/nvme0", "type": "Directory"}}],
          "imagePullSecrets": [{"name": "regcred"}],
          "serviceAccountName": "trainer",
          "priorityClassName": "high",
          "schedulerName": "volcano",
          "terminationGracePeriodSeconds": 600,
          "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                              "fsGroupChangePolicy": "OnRootMismatch"}
        },
        "container": {
          "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}, {"name": "cache", "mountPath": "/cache"}],
          "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "allowPrivilegeEscalation": false},
          "resources": {"requests": {"cpu": "8", "memory": "40Gi"}, "limits": {"cpu": 16}},
          "env": [{"name": "OMP_NUM_THREADS", "value": "4"}]
        }
      }
    }
  })");
}

inline JobSpec MustParse(const Json& job) {
  auto spec = ParseJob(job);
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  return spec.ok() ? *spec : JobSpec{};
}

}  // namespace pstar::op::test
