//! Podman's container names, from its storage (containers/storage keeps
//! every container's id and names in `<root>/<driver>-containers/
//! containers.json`): Podman has no daemon to ask. The name becomes the
//! `container` label; Podman's containers carry no Kubernetes names.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::Deserialize;

use super::container_names::Runtime;
use crate::model::labels::ContainerNames;

/// Podman's storage root for root's containers.
pub const DEFAULT_ROOT: &str = "/var/lib/containers/storage";

#[derive(Deserialize)]
struct Entry {
    id: String,
    #[serde(default)]
    names: Vec<String>,
}

/// Podman's storage at `root`.
pub struct Podman {
    root: PathBuf,
}

impl Podman {
    pub fn new(root: PathBuf) -> Podman {
        Podman { root }
    }
}

/// The name of container `id` in one `containers.json`.
fn name_in(file: &Path, id: &str) -> anyhow::Result<Option<String>> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let entries: Vec<Entry> =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", file.display()))?;
    Ok(entries
        .into_iter()
        .find(|e| e.id == id)
        .and_then(|e| e.names.into_iter().next()))
}

impl Runtime for Podman {
    fn names(&mut self, id: &str) -> anyhow::Result<Option<ContainerNames>> {
        // One file per storage driver (overlay-containers, vfs-containers).
        let dir = std::fs::read_dir(&self.root)
            .with_context(|| format!("reading {}", self.root.display()))?;
        for entry in dir.flatten() {
            if !entry.file_name().to_string_lossy().ends_with("-containers") {
                continue;
            }
            let file = entry.path().join("containers.json");
            if file.is_file()
                && let Some(name) = name_in(&file, id)?
            {
                return Ok(Some(ContainerNames {
                    container: crate::model::labels::truncate(&name),
                    ..Default::default()
                }));
            }
        }
        Ok(None)
    }

    fn describe(&self) -> String {
        format!("Podman's storage at {}", self.root.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_is_named_from_its_storage_file() {
        let dir = std::env::temp_dir().join(format!("gostw-podman-{}", std::process::id()));
        let vfs = dir.join("vfs-containers");
        std::fs::create_dir_all(&vfs).unwrap();
        std::fs::write(
            vfs.join("containers.json"),
            r#"[{"id":"aa","names":["web"],"image":"x","layer":"y"},{"id":"bb","names":[]}]"#,
        )
        .unwrap();
        let mut p = Podman::new(dir.clone());
        assert_eq!(p.names("aa").unwrap().unwrap().container, "web");
        assert_eq!(p.names("bb").unwrap(), None);
        assert_eq!(p.names("cc").unwrap(), None);
        std::fs::write(vfs.join("containers.json"), "not json").unwrap();
        assert!(p.names("aa").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            p.names("aa").is_err(),
            "a missing root is an error, not 'unknown'"
        );
    }
}
