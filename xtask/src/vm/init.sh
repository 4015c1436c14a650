#!/bin/busybox sh
# /init of the VM suite's initramfs (xtask/src/vm/init.sh; `cargo xtask
# vm-test` fills in the @...@ fields). It prepares what the kernel tests
# expect of a host (proc, sys, tracefs, bpffs, cgroups, swap), proves the
# kernel has kprobes, runs the tests and reports their exit code on the serial
# console as `GOSTW_VM_EXIT=<code>`, which the host waits for. Every line the
# host parses starts with GOSTW_VM_. Before the tests it runs `gostw check`
# and prints its answer, a line at a time.

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
# A test or the set-up below that hangs would leave the host nothing but a
# killed VM: shortly before the host's deadline (the tests' or, until the
# tests start, the boot's 180 s), say where every task of the guest waits.
tasks() {
	ps
	for t in /proc/[0-9]*/task/[0-9]*; do
		echo "--- ${t#/proc/} $(cat "$t/comm" 2>/dev/null) state=$(awk '/^State/ {print $2}' "$t/status" 2>/dev/null) wchan=$(cat "$t/wchan" 2>/dev/null)"
		cat "$t/stack" 2>/dev/null
	done
	grep -E '^(MemFree|SwapFree|Dirty|Writeback):' /proc/meminfo
}
(
	sleep 150
	[ -e /tmp/gostw-booted ] && exit 0
	echo "GOSTW_VM_STALL=set-up still running after 150 s; every task:"
	tasks
) &
(
	sleep @STALL_SECS@
	echo "GOSTW_VM_STALL=tests still running after @STALL_SECS@ s; every task:"
	tasks
) &
watchdog=$!

# Loopback, for the tests that talk to the agent over HTTP.
ip link set lo up
echo "GOSTW_VM_KERNEL=$(uname -r)"
# Go reads its clock through the vDSO only where the clocksource allows it
# (tsc, kvm-clock); on hpet every nanotime is a system call.
echo "GOSTW_VM_CLOCKSOURCE=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>&1)"

# The payload is under /gostw; the tests name files by their host paths
# (compiled in), so each host path becomes a link to its guest copy, made
# now that /tmp and the rest are mounted and cannot hide it.
link() {
	[ ! -e "$3" ] && mkdir -p "$1" && ln -s "$2" "$3" || {
		echo "GOSTW_VM_PAYLOAD_ERROR=cannot link $3 to $2 (is $3 a directory the guest makes itself?)"
		finish 96
	}
}
@LINKS@

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

# Kprobes: one on the function the kprobe fault backend hooks first, kept
# enabled during the tests (its hit count is reported at the end), and one on
# openat that must fire at once: the kernel accepts kprobes and runs them.
kp=/sys/kernel/tracing
hits() { awk -v e="$1" '$1 == e {print $2}' "$kp/kprobe_profile"; }
if echo 'p:gostw_vm/do_swap_page do_swap_page' >>"$kp/kprobe_events" &&
	echo 'p:gostw_vm/openat do_sys_openat2' >>"$kp/kprobe_events" &&
	echo 1 >"$kp/events/gostw_vm/enable" &&
	cat /proc/version >/dev/null &&
	[ "$(hits openat)" -gt 0 ]; then
	echo "GOSTW_VM_KPROBES=ok (do_swap_page registered; do_sys_openat2 fired $(hits openat) times)"
else
	echo "GOSTW_VM_KPROBES=missing (kprobe_events: $(cat "$kp/kprobe_events" 2>&1))"
	finish 97
fi
echo 0 >"$kp/events/gostw_vm/openat/enable"
[ -e /sys/kernel/btf/vmlinux ] && echo "GOSTW_VM_BTF=ok" || echo "GOSTW_VM_BTF=missing"
echo "GOSTW_VM_BOOTED=$(cut -d' ' -f1 /proc/uptime)"
touch /tmp/gostw-booted

# What `gostw check` says of this kernel, before any test loads a program:
# the host keeps it as the kernel's row of the docs' matrix.
@GOSTW_BIN@ check >/tmp/gostw-check.txt 2>&1
check=$?
sed 's/^/GOSTW_VM_CHECK_LINE=/' /tmp/gostw-check.txt
echo "GOSTW_VM_CHECK_EXIT=$check"


# A guest stalled in its tests (seen once: 5.10 silent for 9 minutes in
# compat::, QEMU busy) prints nothing more. After @QUIET_SECS@ s without a
# byte sent on the serial console (the UARTs' tx counts), say where every
# task waits; the host then ends this boot. Longer than any test takes here.
(
	last='' quiet=0
	while sleep 15; do
		tx=$(cat /proc/tty/driver/* 2>/dev/null | grep -o 'tx:[0-9]*')
		[ -n "$tx" ] || continue
		if [ "$tx" != "$last" ]; then
			last=$tx quiet=0
			continue
		fi
		quiet=$((quiet + 15))
		[ "$quiet" -ge @QUIET_SECS@ ] || continue
		echo "GOSTW_VM_SILENT=no console output for $quiet s; every task:"
		tasks
		exit 0
	done
) &
quiet_watch=$!

cd /tmp
@ENV@ @TEST_BIN@ --test-threads=1 @TEST_ARGS@
code=$?
kill "$watchdog" "$quiet_watch" 2>/dev/null

echo "GOSTW_VM_KPROBE_HITS=do_swap_page $(hits do_swap_page)"
# Processes still running after the tests (busybox and kernel threads
# aside): a child a test did not end, or gostw's own teardown child
# (kernel/teardown.rs) still removing its probes. The host's summary
# names them.
for p in /proc/[0-9]*; do
	exe=$(readlink "$p/exe" 2>/dev/null) || continue
	[ "$exe" = /bin/busybox ] && continue
	echo "GOSTW_VM_LEFTOVER=${p#/proc/} $exe $(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)"
done
# The probes are not removed: the guest powers off now, and removing one
# once hung a 5.10 guest after its tests had passed (its vCPUs busy, no
# line more), which the host took as a stall and booted again.
finish "$code"
