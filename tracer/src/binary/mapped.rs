//! The bytes of an executable: a read-only mapping of its file, so analysing
//! a 500 MB binary costs page-cache pages the kernel can reclaim, not 500 MB
//! of gostw's own (anonymous) memory; or bytes already in memory (tests).
//!
//! Pages touched by a scan stay in this process's resident set (`RssFile`)
//! until dropped: `release` tells the kernel to drop them from this process
//! (`MADV_DONTNEED`; the page cache keeps them, and the next read maps them
//! again), so the resident set after analysis is what symbolization touches.
//!
//! A mapped file that shrinks while mapped would fault (`SIGBUS`) on the
//! pages past its new end. The files gostw maps are executables: a running
//! one cannot be opened for writing (`ETXTBSY`), and deployments replace
//! binaries by renaming a new file over the old, which leaves this mapping
//! on the old inode.

use std::{fs::File, ops::Deref, path::Path};

/// The bytes of one executable.
pub(crate) enum FileBytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl FileBytes {
    /// Map the file at `path` read-only.
    pub fn map(path: &Path) -> std::io::Result<FileBytes> {
        let file = File::open(path)?;
        let meta = file.metadata()?;
        if meta.is_dir() {
            return Err(std::io::Error::from_raw_os_error(libc::EISDIR));
        }
        if meta.len() == 0 {
            // mmap refuses empty files; an empty file is simply not ELF.
            return Ok(FileBytes::Owned(Vec::new()));
        }
        // SAFETY: the mapping is read-only and nothing writes through it;
        // see the module comment for why the file does not shrink under it.
        let map = unsafe { memmap2::MmapOptions::new().map(&file) }?;
        Ok(FileBytes::Mapped(map))
    }

    /// Drop this process's references to the pages of `start..start+len`
    /// (rounded inwards to whole pages); no-op for owned bytes.
    pub fn release(&self, start: usize, len: usize) {
        let FileBytes::Mapped(map) = self else {
            return;
        };
        let page = crate::procfs::page_size() as usize;
        let end = start.saturating_add(len).min(map.len());
        let first = start.next_multiple_of(page);
        let last = end / page * page;
        if last <= first {
            return;
        }
        // SAFETY: a read-only file mapping, never written: a dropped page
        // reads back the file's contents, unchanged.
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, last - first)
        };
    }

    /// `release` the whole file.
    pub fn release_all(&self) {
        self.release(0, self.len());
    }
}

impl Deref for FileBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(m) => m,
            FileBytes::Owned(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_bytes_read_back_after_release() {
        let path = std::env::temp_dir().join(format!("gostw-mapped-{}", std::process::id()));
        let data: Vec<u8> = (0..3 * 4096 + 17).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let bytes = FileBytes::map(&path).unwrap();
        assert!(matches!(bytes, FileBytes::Mapped(_)));
        assert_eq!(&bytes[..], &data[..]);
        bytes.release(1, 2 * 4096);
        bytes.release_all();
        assert_eq!(&bytes[..], &data[..]);
        std::fs::write(&path, b"").unwrap();
        assert!(FileBytes::map(&path).unwrap().is_empty());
        std::fs::remove_file(&path).unwrap();
        assert!(FileBytes::map(&path).is_err());
        assert!(FileBytes::map(Path::new("/")).is_err());
    }
}
