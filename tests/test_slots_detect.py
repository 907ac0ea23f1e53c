"""What a worker host has: GPUs from a fake NVML (an object with pynvml's functions) or a fake ``nvidia-smi`` on PATH
(a script in tmp), MIG devices counted one by one, restricted by CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES (index,
UUID or its prefix, MIG UUID, GPU:MIG); CPUs as the smaller of the affinity mask and a cgroup v2 ``cpu.max`` or v1
``cpu.cfs_quota_us`` quota in fake cgroup trees, rounded down, at least 1."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from celeryops.slots import detect, gpu_devices
from celeryops.slots.detect import affinity_count, cgroup_cpu_limit, cpu_count

SMI_OUTPUT = """\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5a3c1f7e-0000-1111-2222-333344445555)
  MIG 3g.20gb     Device  0: (UUID: MIG-aaaa0000-1111-2222-3333-444455556666)
  MIG 3g.20gb     Device  1: (UUID: MIG-bbbb0000-1111-2222-3333-444455556666)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-77e1d2c3-0000-1111-2222-333344445555)
GPU 2: Tesla T4 (UUID: GPU-8932f937-d72c-4106-c12f-20bd9faed9f6)
"""


def fake_smi(tmp_path: Path, output: str = SMI_OUTPUT, code: int = 0) -> Path:
    """A ``nvidia-smi`` that prints ``output`` for ``-L`` and exits ``code``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "out.txt").write_text(output)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\n[ "$1" = "-L" ] || exit 2\nwhile IFS= read -r line; do printf "%s\\n" "$line"; done '
                   f'< "{bin_dir / "out.txt"}"\nexit {code}\n')
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return bin_dir


class NoNvml:
    """NVML without a driver: nvmlInit fails the way pynvml's does on a host without GPUs."""

    class NVMLError_LibraryNotFound(Exception):
        pass

    def nvmlInit(self) -> None:
        raise self.NVMLError_LibraryNotFound("NVML Shared Library Not Found")


class FakeNvml:
    """pynvml's calls for GPUs given as (name, uuid, MIG UUIDs or None when MIG is off); bytes like older pynvml."""

    class NVMLError_NotSupported(Exception):
        pass

    class NVMLError_NotFound(Exception):
        pass

    def __init__(self, gpus: list[tuple[str, str, list[str | None] | None]]) -> None:
        self.gpus = gpus
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> tuple[int, int | None]:
        return (i, None)

    def nvmlDeviceGetUUID(self, h: tuple[int, int | None]) -> bytes:
        _name, uuid, migs = self.gpus[h[0]]
        return (uuid if h[1] is None else str((migs or [])[h[1]])).encode()

    def nvmlDeviceGetName(self, h: tuple[int, int | None]) -> bytes:
        return self.gpus[h[0]][0].encode()

    def nvmlDeviceGetMigMode(self, h: tuple[int, int | None]) -> tuple[int, int]:
        migs = self.gpus[h[0]][2]
        if migs is None:
            raise self.NVMLError_NotSupported()
        return (1, 1) if migs else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: tuple[int, int | None]) -> int:
        return len(self.gpus[h[0]][2] or [])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: tuple[int, int | None], j: int) -> tuple[int, int]:
        if (self.gpus[h[0]][2] or [])[j] is None:
            raise self.NVMLError_NotFound()
        return (h[0], j)


NVML_GPUS: list[tuple[str, str, list[str | None] | None]] = [
    ("NVIDIA H100", "GPU-1111aaaa-0000", None),  # no MIG support
    ("NVIDIA A100", "GPU-2222bbbb-0000", ["MIG-c1", None, "MIG-c3"]),  # MIG on, one slot empty
    ("NVIDIA A100", "GPU-3333cccc-0000", []),  # MIG supported, off
]


def ids(env: dict[str, str], **kw: Any) -> list[int | str]:
    return [g.id for g in gpu_devices(env=env, **kw)[0]]


def test_nvml_lists_gpus_and_counts_mig_devices_one_by_one() -> None:
    nvml = FakeNvml(NVML_GPUS)
    devices, how = gpu_devices(nvml=nvml, env={})
    assert [d.id for d in devices] == [0, "MIG-c1", "MIG-c3", 2] and how == "NVML"
    assert [(d.index, d.mig, d.gpu_uuid) for d in devices[1:3]] == [(1, 0, "GPU-2222bbbb-0000"),
                                                                    (1, 2, "GPU-2222bbbb-0000")]
    assert nvml.calls == ["init", "shutdown"]
    found = detect(nvml=nvml, env={})
    assert found.totals["gpu"] == 4 and found.devices["gpu"] == [0, "MIG-c1", "MIG-c3", 2]
    assert found.notes["gpu"] == "gpu 4 (NVML): 0, MIG-c1, MIG-c3, 2"


def test_nvidia_smi_on_path_when_nvml_does_not_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(fake_smi(tmp_path)))
    devices, how = gpu_devices(nvml=NoNvml(), env={})
    assert [d.id for d in devices] == ["MIG-aaaa0000-1111-2222-3333-444455556666",
                                       "MIG-bbbb0000-1111-2222-3333-444455556666", 1, 2]
    assert how == "nvidia-smi -L" and devices[3].name == "Tesla T4"
    assert detect(nvml=NoNvml(), env={}).totals["gpu"] == 4


def test_visible_devices_restrict_by_index_uuid_prefix_and_mig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(fake_smi(tmp_path)))
    nv = NoNvml()
    assert ids({"CUDA_VISIBLE_DEVICES": "2,1"}, nvml=nv) == [1, 2]  # the host's order
    assert ids({"CUDA_VISIBLE_DEVICES": "GPU-8932f937"}, nvml=nv) == [2]  # a unique prefix, as CUDA takes it
    assert ids({"CUDA_VISIBLE_DEVICES": "MIG-bbbb0000-1111-2222-3333-444455556666"}, nvml=nv) == [
        "MIG-bbbb0000-1111-2222-3333-444455556666"]
    assert len(ids({"CUDA_VISIBLE_DEVICES": "0"}, nvml=nv)) == 2  # a GPU in MIG mode brings its MIG devices
    assert ids({"NVIDIA_VISIBLE_DEVICES": "0:1,2"}, nvml=nv) == ["MIG-bbbb0000-1111-2222-3333-444455556666", 2]
    assert ids({"NVIDIA_VISIBLE_DEVICES": "all"}, nvml=nv) == ids({}, nvml=nv)
    assert ids({"CUDA_VISIBLE_DEVICES": "1,2", "NVIDIA_VISIBLE_DEVICES": "2"}, nvml=nv) == [2]  # both apply
    for hidden in ("", "-1", "none", "void"):
        devices, how = gpu_devices(nvml=nv, env={"NVIDIA_VISIBLE_DEVICES" if hidden in ("none", "void")
                                                 else "CUDA_VISIBLE_DEVICES": hidden})
        assert devices == [] and "hides every GPU" in how
    devices, how = gpu_devices(nvml=nv, env={"CUDA_VISIBLE_DEVICES": "1,7"})
    assert [d.id for d in devices] == [1]
    assert "CUDA_VISIBLE_DEVICES names '7', which this host does not show" in how
    nvml_devices, _ = gpu_devices(nvml=FakeNvml(NVML_GPUS), env={"CUDA_VISIBLE_DEVICES": "GPU-2222,0"})
    assert [d.id for d in nvml_devices] == [0, "MIG-c1", "MIG-c3"]


def test_no_gpu_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    found = detect(nvml=NoNvml(), env={})
    assert found.totals["gpu"] == 0 and found.devices["gpu"] == []
    assert found.notes["gpu"] == ("gpu 0 (no GPU found: NVML did not start (NVMLError_LibraryNotFound), and "
                                  "nvidia-smi is not on PATH)")
    monkeypatch.setenv("PATH", str(fake_smi(tmp_path, "NVIDIA-SMI has failed because it couldn't communicate with "
                                                      "the NVIDIA driver.\n", code=9)))
    devices, how = gpu_devices(nvml=NoNvml(), env={})
    assert devices == [] and "nvidia-smi -L exited 9: NVIDIA-SMI has failed" in how


def test_gpu_set_by_hand_means_devices_zero_to_n_minus_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(fake_smi(tmp_path)))
    found = detect({"GPU": 2, "licence": 5}, nvml=NoNvml(), env={"CUDA_VISIBLE_DEVICES": "2"})
    assert found.totals == {"cpu": cpu_count(), "gpu": 2, "licence": 5}
    assert found.devices == {"gpu": [0, 1]} and found.notes["gpu"] == "gpu 2 (set by hand)"
    assert detect({"cpu": 3}, probe=False).totals == {"cpu": 3}  # CELERYOPS_SLOTS_DETECT=0: only what is set


def cgroup_v2(root: Path, cpu_max: dict[str, str], own: str = "/") -> tuple[Path, Path]:
    """A unified hierarchy under ``root`` with ``cpu.max`` at the given relative paths; /proc/self/cgroup says
    the process is in ``own``."""
    (root / "cgroup.controllers").parent.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    for rel, text in cpu_max.items():
        d = root / rel.strip("/")
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpu.max").write_text(text + "\n")
    (root / own.strip("/")).mkdir(parents=True, exist_ok=True)
    proc = root.parent / "proc-self-cgroup"
    proc.write_text(f"0::{own}\n")
    return root, proc


def test_cgroup_v2_quota_caps_the_affinity_mask(tmp_path: Path) -> None:
    mask = affinity_count()
    root, proc = cgroup_v2(tmp_path / "v2", {"/": "max 100000"})
    assert cgroup_cpu_limit(root, proc) is None and cpu_count(root, proc) == mask
    root, proc = cgroup_v2(tmp_path / "v2q", {"/": "150000 100000"})  # 1.5 CPUs, as Cloud Run / a k8s limit
    assert cgroup_cpu_limit(root, proc) == 1.5 and cpu_count(root, proc) == 1
    root, proc = cgroup_v2(tmp_path / "v2s", {"/": "20000 100000"})  # 0.2 CPU: still one slot
    assert cpu_count(root, proc) == 1
    # the smallest quota on the way from the process's cgroup up to the root
    root, proc = cgroup_v2(tmp_path / "v2n", {"/kubepods": "400000 100000", "/kubepods/pod1/c1": "max 100000"},
                           own="/kubepods/pod1/c1")
    assert cgroup_cpu_limit(root, proc) == 4.0 and cpu_count(root, proc) == min(mask, 4)
    note = detect(cgroup_root=root, self_cgroup=proc, nvml=NoNvml(), smi="no-such-smi", env={}).notes["cpu"]
    assert note.startswith(f"cpu {min(mask, 4)} (")


def test_cgroup_v1_cfs_quota(tmp_path: Path) -> None:
    root = tmp_path / "v1"
    for mount in ("cpu,cpuacct", "memory"):
        (root / mount / "docker" / "abc").mkdir(parents=True)
    cpu = root / "cpu,cpuacct"
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    (cpu / "docker" / "abc" / "cpu.cfs_quota_us").write_text("250000\n")
    (cpu / "docker" / "abc" / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n")
    assert cgroup_cpu_limit(root, proc) == 2.5
    assert cpu_count(root, proc) == min(affinity_count(), 2)
    # inside the container's own mount the host's path does not exist: the mount's own files count
    proc.write_text("4:cpu,cpuacct:/docker/zzz\n")
    assert cgroup_cpu_limit(root, proc) is None
    (cpu / "cpu.cfs_quota_us").write_text("300000\n")
    assert cgroup_cpu_limit(root, proc) == 3.0
    assert cgroup_cpu_limit(tmp_path / "nothing", tmp_path / "nothing-either") is None


def test_this_machine_is_read_without_error() -> None:
    found = detect(env=dict(os.environ))
    assert found.totals["cpu"] >= 1 and found.totals["gpu"] == len(found.devices["gpu"])
