#!/bin/busybox sh
# /init of the VM suite's initramfs (xtask/src/vm/init.sh; `cargo xtask
# vm-test` fills in the @...@ fields). It prepares what the kernel tests
# expect of a host (proc, sys, tracefs, bpffs, cgroups, swap), proves the
# kernel has kprobes, runs the tests and reports their exit code on the serial
# console as `GOSTW_VM_EXIT=<code>`, which the host waits for. Every line the
# host parses starts with GOSTW_VM_.

/bin/busybox --install -s /bin
export PATH=/bin HOME=/root TMPDIR=/tmp

finish() {
	echo "GOSTW_VM_EXIT=$1"
	sync
	poweroff -f
	echo o >/proc/sysrq-trigger
}

mkdir -p /proc /sys /dev /tmp /root /run
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo "GOSTW_VM_KERNEL=$(uname -r)"

# Modules from the kernel's own package, dependencies first.
for m in @MODULES@; do
	insmod "/lib/modules/$m" || echo "GOSTW_VM_WARNING=insmod $m failed"
done

# Swap on the virtio disk the host attached (empty, made fresh each run).
swap=none
for _ in 1 2 3 4 5 6 7 8 9 10; do
	[ -b /dev/vda ] && break
	sleep 0.2
done
if [ -b /dev/vda ] && mkswap /dev/vda >/dev/null && swapon /dev/vda; then
	swap="/dev/vda $(awk '/^SwapTotal/ {print $2 " kB"}' /proc/meminfo)"
fi
echo "GOSTW_VM_SWAP=$swap"

# Kprobes: register one on the function the kprobe fault backend hooks first,
# keep it enabled during the tests and report its hit count at the end.
kp=/sys/kernel/tracing
if echo 'p:gostw_vm/do_swap_page do_swap_page' >>"$kp/kprobe_events" 2>/dev/null &&
	echo 1 >"$kp/events/gostw_vm/do_swap_page/enable"; then
	echo "GOSTW_VM_KPROBES=ok ($(cat "$kp/kprobe_events"))"
else
	echo "GOSTW_VM_KPROBES=missing (kprobe_events rejected do_swap_page)"
	finish 97
fi
[ -e /sys/kernel/btf/vmlinux ] && echo "GOSTW_VM_BTF=ok" || echo "GOSTW_VM_BTF=missing"
echo "GOSTW_VM_BOOTED=$(cut -d' ' -f1 /proc/uptime)"

cd /tmp
@ENV@ @TEST_BIN@ --test-threads=1 @TEST_ARGS@
code=$?

echo "GOSTW_VM_KPROBE_HITS=$(awk '$1 == "do_swap_page" {print $2}' "$kp/kprobe_profile")"
echo 0 >"$kp/events/gostw_vm/do_swap_page/enable"
echo '-:gostw_vm/do_swap_page' >>"$kp/kprobe_events"
finish "$code"
