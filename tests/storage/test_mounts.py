from gpuready.storage.mounts import classify, mount_map, parse_mountinfo

# A Docker container on a rental host (AutoDL-like): overlay root, data disk and file storage bind-mounted in,
# the usual /etc/hosts file binds, pseudo filesystems. Shape of real /proc/self/mountinfo lines (proc(5)).
AUTODL_CONTAINER = """\
1510 1398 0:145 / / rw,relatime - overlay overlay rw,lowerdir=/l/A:/l/B,upperdir=/x/d,workdir=/x/w
1511 1510 0:148 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
1512 1510 0:149 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
1513 1512 0:150 / /dev/pts rw,nosuid,noexec,relatime - devpts devpts rw,gid=5,mode=620,ptmxmode=666
1514 1510 0:151 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro
1515 1514 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw
1516 1512 0:147 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=65536k
1517 1510 253:16 /autodl/container-1/tmp /root/autodl-tmp rw,relatime - xfs /dev/vdb rw,attr2,inode64,prjquota
1518 1510 0:52 /user-1 /root/autodl-fs rw,relatime - fuse.juicefs JuiceFS:autodl rw,user_id=0,group_id=0
1519 1510 253:1 /var/lib/docker/containers/c/resolv.conf /etc/resolv.conf rw,relatime - ext4 /dev/vda1 rw
1520 1510 253:1 /var/lib/docker/containers/c/hostname /etc/hostname rw,relatime - ext4 /dev/vda1 rw
1521 1510 253:1 /var/lib/docker/containers/c/hosts /etc/hosts rw,relatime - ext4 /dev/vda1 rw
1522 1510 0:155 / /tmp/my\\040space rw,relatime - tmpfs tmpfs rw
"""

# RunPod-like: overlay container disk, the volume disk mounted at /workspace.
RUNPOD_CONTAINER = """\
2001 1900 0:300 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
2002 2001 0:301 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
2003 2001 8:17 /volumes/abc /workspace rw,relatime shared:5 master:2 - xfs /dev/sdb1 rw,prjquota
"""

SIZES = {
    "/": (30 * 10**9, 5 * 10**9, 25 * 10**9),
    "/root/autodl-tmp": (50 * 10**9, 49 * 10**9, 10**9),
    "/root/autodl-fs": (20 * 10**9, 20 * 10**9, 0),
    "/workspace": (100 * 10**9, 90 * 10**9, 10 * 10**9),
}


def fake_usage(path: str) -> tuple[int, int, int] | None:
    return SIZES.get(path)


def test_overlay_root_is_the_system_disk_and_pseudo_mounts_are_hidden() -> None:
    m = mount_map(
        AUTODL_CONTAINER,
        usage=fake_usage,
        exists=lambda p: p in ("/root/autodl-tmp", "/root/autodl-fs"),
        home="/root",
        cwd="/root/autodl-tmp/project",
    )
    by_mp = {i.mount_point: i for i in m.mounts}
    # psutil.disk_partitions() would drop the overlay root and the fuse mount; we keep both
    assert by_mp["/"].fstype == "overlay" and by_mp["/"].kind == "system"
    assert by_mp["/"].holds == ["/", "home"]
    assert "quota" in by_mp["/"].note
    assert by_mp["/root/autodl-tmp"].kind == "data"
    assert by_mp["/root/autodl-tmp"].holds == ["cwd"]
    assert by_mp["/root/autodl-fs"].kind == "network"
    assert by_mp["/tmp/my space"].kind == "memory"  # \040 unescaped
    assert by_mp["/dev/shm"].kind == "memory"  # shared memory is where data goes to be fast: shown (issue 9)
    for hidden in ("/proc", "/sys", "/etc/hosts", "/etc/resolv.conf", "/sys/fs/cgroup"):
        assert hidden not in by_mp
    assert by_mp["/"].free_bytes == 5 * 10**9


def test_autodl_layout_is_recognised_with_what_typically_survives() -> None:
    m = mount_map(
        AUTODL_CONTAINER,
        usage=fake_usage,
        exists=lambda p: p in ("/root/autodl-tmp", "/root/autodl-fs"),
        home="/root",
        cwd="/root",
    )
    assert m.platforms == ["AutoDL"]
    layout = {s.path: s for s in m.layout}
    assert layout["/root/autodl-tmp"].layout.survives_release is False
    assert layout["/root/autodl-tmp"].layout.in_saved_image is False
    assert layout["/root/autodl-fs"].layout.survives_release is True
    assert layout["/root/autodl-fs"].mount_point == "/root/autodl-fs"
    assert layout["/root/autodl-pub"].exists is False
    assert "autodl.com" in layout["/"].layout.source or "gpuhub" in layout["/"].layout.source
    tmp = next(i for i in m.mounts if i.mount_point == "/root/autodl-tmp")
    assert tmp.platform == "AutoDL" and tmp.layout is not None and tmp.layout.role == "data"


def test_runpod_is_recognised_by_a_workspace_mount_not_by_a_workspace_folder() -> None:
    m = mount_map(RUNPOD_CONTAINER, usage=fake_usage, exists=lambda p: False, home="/root", cwd="/workspace")
    assert m.platforms == ["RunPod"]
    ws = next(i for i in m.mounts if i.mount_point == "/workspace")
    assert ws.kind == "data" and ws.layout is not None and ws.layout.survives_stop is True
    root = m.system
    assert root is not None and root.layout is not None and root.layout.survives_stop is False
    # an NGC-style image that merely has a /workspace folder on its overlay root is not RunPod
    plain = "\n".join(RUNPOD_CONTAINER.splitlines()[:2])
    plain_map = mount_map(plain, usage=fake_usage, exists=lambda p: p == "/workspace", home="/root")
    assert plain_map.platforms == []


def test_bind_mount_of_the_root_device_counts_as_system_and_unknown_usage_is_a_value() -> None:
    text = (
        "27 1 254:0 / / rw - ext4 /dev/vda rw\n"
        "40 27 254:0 /srv/data /data rw - ext4 /dev/vda rw\n"
        "41 27 8:1 / /mnt/disk rw - ext4 /dev/sda1 rw\n"
        "42 27 0:60 / /mnt/nfs rw - nfs4 server:/export rw\n"
        "garbage line\n"
    )
    mounts = parse_mountinfo(text)
    assert [m.mount_point for m in mounts] == ["/", "/data", "/mnt/disk", "/mnt/nfs"]
    assert [classify(m, "254:0") for m in mounts] == ["system", "system", "data", "network"]
    mm = mount_map(text, usage=lambda p: None, exists=lambda p: False, home="/home/u", cwd="/")
    assert all(i.total_bytes is None and i.free_bytes is None for i in mm.mounts)
    deep, sibling = mm.mount_for("/mnt/disk/x/y"), mm.mount_for("/mnt/diskette")
    assert deep is not None and deep.mount_point == "/mnt/disk"
    assert sibling is not None and sibling.mount_point == "/"
