//! Where gostw's outputs go: files written whole or not at all (under a
//! temporary name in their directory, renamed when complete), the checks a
//! path gets before tracing starts, and noticing that the reader of
//! standard output has gone.

use std::{
    fs::File,
    io::{self, BufWriter, Write},
    os::{
        fd::RawFd,
        unix::fs::{FileTypeExt as _, OpenOptionsExt as _},
    },
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

/// A file that appears at its path only once written completely. A path
/// naming a device, pipe or socket is written in place (there is nothing
/// to rename over it).
pub struct WholeFile {
    path: PathBuf,
    /// The temporary name written to, until `commit`.
    tmp: Option<PathBuf>,
    out: BufWriter<File>,
}

impl WholeFile {
    /// Start writing `path`: its directory must exist and be writable.
    pub fn create(path: &Path) -> io::Result<WholeFile> {
        if is_special(path) {
            let out = BufWriter::new(File::options().write(true).open(path)?);
            return Ok(WholeFile {
                path: path.to_owned(),
                tmp: None,
                out,
            });
        }
        if path.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::EISDIR));
        }
        let name = path
            .file_name()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EISDIR))?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".gostw-{}.tmp", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let file = File::options()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)?;
        Ok(WholeFile {
            path: path.to_owned(),
            tmp: Some(tmp),
            out: BufWriter::new(file),
        })
    }

    /// Everything is written: give the file its name.
    pub fn commit(mut self) -> io::Result<()> {
        self.out.flush()?;
        if let Some(tmp) = self.tmp.take()
            && let Err(e) = std::fs::rename(&tmp, &self.path)
        {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(())
    }

    /// Write `bytes` as the whole of `path`.
    pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut f = WholeFile::create(path)?;
        f.write_all(bytes)?;
        f.commit()
    }
}

impl Write for WholeFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

impl Drop for WholeFile {
    /// Never completed: no file, and no temporary one left behind.
    fn drop(&mut self) {
        if let Some(tmp) = &self.tmp {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// A `WholeFile` written through one handle (a report's output) and
/// completed through another (after the report's last line).
#[derive(Clone)]
pub struct SharedFile(Arc<Mutex<Option<WholeFile>>>);

impl SharedFile {
    pub fn new(f: WholeFile) -> SharedFile {
        SharedFile(Arc::new(Mutex::new(Some(f))))
    }

    /// Give the file its name; later writes fail.
    pub fn commit(&self) -> io::Result<()> {
        match self.0.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(f) => f.commit(),
            None => Ok(()),
        }
    }
}

impl Write for SharedFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut *self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(f) => f.write(buf),
            None => Err(io::Error::other("written after it was completed")),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut *self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

/// A character or block device, a FIFO or a socket.
fn is_special(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| {
        let t = m.file_type();
        t.is_char_device() || t.is_block_device() || t.is_fifo() || t.is_socket()
    })
}

/// Why `path` cannot be an output file (`--output`, `--timeline`): a
/// directory, or a name ending in `/`. Devices and pipes are written in
/// place.
pub fn check_output_path(path: &Path) -> Result<(), String> {
    if path.as_os_str().as_encoded_bytes().ends_with(b"/") || path.is_dir() {
        return Err(format!(
            "{} is a directory: give a file name (e.g. {})",
            path.display(),
            path.join("gostw.out").display()
        ));
    }
    Ok(())
}

/// Why `path` cannot be given to `--pprof`: besides `check_output_path`,
/// anything that exists and is not a regular file (attach and run write one
/// file per profile beside the name given, e.g. NAME.faults.pb.gz).
pub fn check_profile_path(path: &Path) -> Result<(), String> {
    check_output_path(path)?;
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(format!(
            "{} is not a regular file: give a file name in a writable directory \
             (e.g. ./gostw.pb.gz; attach and run write gostw.faults.pb.gz and \
             gostw.stackgrowth.pb.gz from it)",
            path.display()
        )),
        _ => Ok(()),
    }
}

/// Standard output, when it is a pipe or a socket: its reader can go away.
pub fn stdout_pipe() -> Option<RawFd> {
    // SAFETY: zeroed stat is a valid out-parameter for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd 1 and a valid out-pointer.
    if unsafe { libc::fstat(libc::STDOUT_FILENO, &mut st) } != 0 {
        return None;
    }
    let kind = st.st_mode & libc::S_IFMT;
    (kind == libc::S_IFIFO || kind == libc::S_IFSOCK).then_some(libc::STDOUT_FILENO)
}

/// Whether the reading end of the pipe or socket `fd` writes to is closed
/// (poll says POLLERR or POLLHUP; no wait).
pub fn reader_gone(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0
}

#[cfg(test)]
pub(crate) mod tests {
    use std::os::fd::AsRawFd as _;

    use super::*;

    /// A fresh scratch directory for test `name`.
    pub(crate) fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gostw-file-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// The names in `d`, sorted.
    pub(crate) fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// The file appears, whole, only when committed; a file never
    /// committed leaves nothing behind, not even an old file's replacement.
    #[test]
    fn a_file_appears_whole_or_not_at_all() {
        let d = dir("whole");
        let path = d.join("t.json");
        let mut f = WholeFile::create(&path).unwrap();
        f.write_all(b"[1,").unwrap();
        f.flush().unwrap();
        assert!(!path.exists());
        f.write_all(b"2]").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"[1,2]");
        assert_eq!(names(&d), ["t.json"]);

        let mut f = WholeFile::create(&path).unwrap();
        f.write_all(b"[3,").unwrap();
        drop(f);
        assert_eq!(std::fs::read(&path).unwrap(), b"[1,2]");
        assert_eq!(names(&d), ["t.json"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_shared_file_is_completed_by_its_other_handle() {
        let d = dir("shared");
        let path = d.join("out.txt");
        let f = SharedFile::new(WholeFile::create(&path).unwrap());
        let mut w = f.clone();
        w.write_all(b"line\n").unwrap();
        assert!(!path.exists());
        f.commit().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"line\n");
        assert!(w.write_all(b"late").is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn directories_and_devices_are_refused_as_profile_names() {
        let d = dir("check");
        for bad in [d.clone(), d.join("sub/"), PathBuf::from("/dev/full")] {
            let e = check_profile_path(&bad).unwrap_err();
            assert!(e.contains("give a file name"), "{e}");
        }
        assert!(check_output_path(&d).is_err());
        assert!(check_output_path(Path::new("/dev/null")).is_ok());
        assert!(check_profile_path(&d.join("p.pb.gz")).is_ok());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_closed_pipe_reader_is_noticed() {
        let (r, w) = std::io::pipe().unwrap();
        assert!(!reader_gone(w.as_raw_fd()));
        drop(r);
        assert!(reader_gone(w.as_raw_fd()));
    }
}
