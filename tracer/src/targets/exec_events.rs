//! Exec notifications from the kernel's process events connector (netlink
//! `NETLINK_CONNECTOR`, `CN_IDX_PROC`): a new program wakes the agent for a
//! `/proc` poll at once instead of at the next poll interval. Optional: where
//! the connector is unavailable (no `CAP_NET_ADMIN`, a network namespace other
//! than the host's, a kernel without `CONFIG_PROC_EVENTS`), polling alone
//! still finds every process, one interval later.

use std::{io, mem, sync::mpsc, thread};

const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_EXEC: u32 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_HDRLEN: usize = 16;
const CN_MSG_LEN: usize = 20;

/// Subscribe to process events; every exec sends its pid on the returned
/// channel (from a thread of its own).
pub fn watch() -> io::Result<mpsc::Receiver<u32>> {
    // SAFETY: plain syscall.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_CONNECTOR,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: we own the new descriptor; OwnedFd closes it on every path.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    // SAFETY: zeroed sockaddr_nl is valid; fields set below.
    let mut addr: libc::sockaddr_nl = unsafe { mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    addr.nl_groups = CN_IDX_PROC;
    // SAFETY: valid socket, address and length.
    let ret = unsafe {
        libc::bind(
            raw,
            (&raw const addr).cast(),
            mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    let msg = listen_message(std::process::id());
    // SAFETY: valid socket and buffer.
    let sent = unsafe { libc::send(raw, msg.as_ptr().cast(), msg.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name("gostw-exec".into())
        .spawn(move || {
            // The thread owns the socket: it closes when the thread ends.
            let _socket = fd;
            let mut buf = vec![0u8; 8192];
            loop {
                // SAFETY: valid socket and buffer.
                let n = unsafe { libc::recv(raw, buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n < 0 {
                    let e = io::Error::last_os_error();
                    match e.raw_os_error() {
                        // ENOBUFS: events were dropped; polling catches up.
                        Some(libc::EINTR | libc::ENOBUFS) => continue,
                        _ => {
                            log::warn!("process events connector: {e}; polling only");
                            return;
                        }
                    }
                }
                for pid in exec_pids(&buf[..n as usize]) {
                    if tx.send(pid).is_err() {
                        return; // the agent stopped
                    }
                }
            }
        })?;
    Ok(rx)
}

/// The `PROC_CN_MCAST_LISTEN` request.
fn listen_message(port: u32) -> Vec<u8> {
    let len = NLMSG_HDRLEN + CN_MSG_LEN + 4;
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&NLMSG_DONE.to_ne_bytes());
    m.extend_from_slice(&0u16.to_ne_bytes()); // flags
    m.extend_from_slice(&0u32.to_ne_bytes()); // seq
    m.extend_from_slice(&port.to_ne_bytes());
    m.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
    m.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes()); // seq
    m.extend_from_slice(&0u32.to_ne_bytes()); // ack
    m.extend_from_slice(&4u16.to_ne_bytes()); // data length
    m.extend_from_slice(&0u16.to_ne_bytes()); // flags
    m.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
    m
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Thread-group ids of the exec events in one datagram (netlink messages,
/// each a `cn_msg` carrying a `proc_event`). Anything else, or anything
/// truncated, is skipped.
pub fn exec_pids(datagram: &[u8]) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut at = 0;
    while let Some(len) = u32_at(datagram, at).map(|l| l as usize) {
        if len < NLMSG_HDRLEN || at + len > datagram.len() {
            break;
        }
        let msg = &datagram[at..at + len];
        // proc_event: what, cpu, timestamp_ns (u64), then event_data; for an
        // exec: process_pid, process_tgid.
        let ev = NLMSG_HDRLEN + CN_MSG_LEN;
        if u32_at(msg, ev) == Some(PROC_EVENT_EXEC)
            && let Some(tgid) = u32_at(msg, ev + 20)
        {
            pids.push(tgid);
        }
        at += (len + 3) & !3;
    }
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(what: u32, pid: u32, tgid: u32) -> Vec<u8> {
        let mut m = listen_message(0);
        m.truncate(NLMSG_HDRLEN + CN_MSG_LEN);
        m.extend_from_slice(&what.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes()); // cpu
        m.extend_from_slice(&0u64.to_ne_bytes()); // timestamp
        m.extend_from_slice(&pid.to_ne_bytes());
        m.extend_from_slice(&tgid.to_ne_bytes());
        let len = m.len() as u32;
        m[..4].copy_from_slice(&len.to_ne_bytes());
        m
    }

    #[test]
    fn exec_events_give_their_tgid_others_are_skipped() {
        let mut d = event(PROC_EVENT_EXEC, 11, 10);
        d.extend(event(1 /* fork */, 12, 12));
        d.extend(event(PROC_EVENT_EXEC, 20, 20));
        assert_eq!(exec_pids(&d), [10, 20]);
        assert!(exec_pids(&d[..30]).is_empty());
        assert!(exec_pids(&[]).is_empty());
        let mut bad = event(PROC_EVENT_EXEC, 1, 1);
        bad[..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(exec_pids(&bad).is_empty());
    }

    #[test]
    fn listen_message_layout() {
        let m = listen_message(7);
        assert_eq!(m.len(), 40);
        assert_eq!(u32_at(&m, 0), Some(40));
        assert_eq!(u32_at(&m, 12), Some(7));
        assert_eq!(u32_at(&m, 16), Some(CN_IDX_PROC));
        assert_eq!(u32_at(&m, 36), Some(PROC_CN_MCAST_LISTEN));
    }
}
