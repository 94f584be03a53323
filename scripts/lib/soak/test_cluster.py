"""Unit tests of the soak's pure pieces (python3 -m unittest, from make lint)."""

import os
import tempfile
import unittest

from cluster import pod_cgroup_has_processes

UID = "44d9cd1a-8e2e-4029-93af-a1d7b7bf96f6"


def cgroup(root, path, procs):
    d = os.path.join(root, path)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "cgroup.procs"), "w", encoding="utf-8") as f:
        f.write(procs)


class PodCgroupTest(unittest.TestCase):
    def test_a_pod_with_a_process_in_a_container_cgroup_runs(self):
        with tempfile.TemporaryDirectory() as root:
            cgroup(root, f"kubepods/besteffort/pod{UID}", "")
            cgroup(root, f"kubepods/besteffort/pod{UID}/abc123", "4242\n")
            self.assertTrue(pod_cgroup_has_processes(root, UID))

    def test_a_guaranteed_pod_directly_under_kubepods_is_found(self):
        with tempfile.TemporaryDirectory() as root:
            cgroup(root, f"kubepods/pod{UID}/abc123", "7\n")
            self.assertTrue(pod_cgroup_has_processes(root, UID))

    def test_a_pod_cgroup_left_empty_after_teardown_does_not_run(self):
        with tempfile.TemporaryDirectory() as root:
            cgroup(root, f"kubepods/burstable/pod{UID}", "")
            cgroup(root, f"kubepods/burstable/pod{UID}/abc123", "")
            self.assertFalse(pod_cgroup_has_processes(root, UID))

    def test_a_pod_without_a_cgroup_does_not_run(self):
        with tempfile.TemporaryDirectory() as root:
            cgroup(root, "kubepods/besteffort/podother/abc", "9\n")
            self.assertFalse(pod_cgroup_has_processes(root, UID))

    def test_another_pods_processes_do_not_count(self):
        with tempfile.TemporaryDirectory() as root:
            cgroup(root, f"kubepods/besteffort/pod{UID}", "")
            cgroup(root, "kubepods/besteffort/podother/abc", "9\n")
            self.assertFalse(pod_cgroup_has_processes(root, UID))

    def test_a_missing_root_is_not_running(self):
        self.assertFalse(pod_cgroup_has_processes("/nonexistent/podnet-soak-test", UID))


if __name__ == "__main__":
    unittest.main()
