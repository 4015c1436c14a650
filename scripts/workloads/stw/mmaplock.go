package main

import (
	"flag"
	"fmt"
	"os"
	"syscall"
)

var (
	mmapLockMB     = flag.Int("mmap-lock-mb", 0, "MiB of a populated mapping whose page faults wait for the address space's lock: a holder goroutine keeps changing its protection (mprotect holds mmap_lock for writing while it rewrites every page table entry) and a toucher goroutine keeps dropping and touching pages of it (0: off)")
	mmapLockHolder = flag.Bool("mmap-lock-holder", true, "run the holder beside the toucher (false: the toucher alone, whose faults then wait for no one)")
)

// startMmapLock starts the toucher, and the holder unless told not to.
func startMmapLock(mb int, holder bool) {
	mem, err := syscall.Mmap(-1, 0, mb<<20, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_POPULATE)
	if err != nil {
		fmt.Fprintf(os.Stderr, "-mmap-lock-mb %d: mmap: %v\n", mb, err)
		os.Exit(2)
	}
	if holder {
		go holdMmapLock(mem)
	}
	go touchPages(mem[:256*os.Getpagesize()])
}

// holdMmapLock keeps the address space's lock held for writing: each
// protection change (adding or removing PROT_EXEC) walks the mapping's page
// tables under it.
//
//go:noinline
func holdMmapLock(mem []byte) {
	rw := syscall.PROT_READ | syscall.PROT_WRITE
	for i := 0; ; i++ {
		prot := rw
		if i%2 == 0 {
			prot |= syscall.PROT_EXEC
		}
		if err := syscall.Mprotect(mem, prot); err != nil {
			fmt.Fprintf(os.Stderr, "mprotect: %v\n", err)
			os.Exit(2)
		}
	}
}

// touchPages drops its pages and touches them again, forever: each touch is
// a page fault taken while the goroutine runs (holding its P), which waits
// for the address space's lock whenever the holder has it.
//
//go:noinline
func touchPages(mem []byte) {
	page := os.Getpagesize()
	for {
		if err := syscall.Madvise(mem, 4 /* MADV_DONTNEED */); err != nil {
			fmt.Fprintf(os.Stderr, "madvise: %v\n", err)
			os.Exit(2)
		}
		// A store, not a read and a write: a read first would map the
		// shared zero page, and the write then copy it (two faults and a
		// TLB shootdown per page instead of one fault).
		for off := 0; off < len(mem); off += page {
			mem[off] = 1
		}
	}
}

var (
	touchMB   = flag.Int("touch-mb", 0, "MiB of fresh memory each toucher keeps dropping and touching again, page by page (page faults that zero a page each, and huge pages where transparent huge pages are on; 0: off)")
	touchers  = flag.Int("touchers", 2, "goroutines touching -touch-mb MiB each")
	touchHuge = flag.Bool("touch-huge", false, "ask for transparent huge pages for the touchers' memory (madvise MADV_HUGEPAGE; in effect where /sys/kernel/mm/transparent_hugepage/enabled is madvise or always): a fault then zeroes and charges 2 MiB at once")
)

// startTouchers starts n goroutines, each dropping and touching its own
// mb MiB mapping again and again.
func startTouchers(n, mb int) {
	for i := 0; i < n; i++ {
		mem, err := syscall.Mmap(-1, 0, mb<<20, syscall.PROT_READ|syscall.PROT_WRITE,
			syscall.MAP_PRIVATE|syscall.MAP_ANON)
		if err != nil {
			fmt.Fprintf(os.Stderr, "-touch-mb %d: mmap: %v\n", mb, err)
			os.Exit(2)
		}
		if *touchHuge {
			if err := syscall.Madvise(mem, 14 /* MADV_HUGEPAGE */); err != nil {
				fmt.Fprintf(os.Stderr, "-touch-huge: madvise: %v\n", err)
				os.Exit(2)
			}
		}
		go touchPages(mem)
	}
}
