//! Read positions saved across restarts: one JSON file per tail stage in
//! the state directory, replaced atomically (written to a temporary file,
//! synced, renamed), so a crash leaves the old positions or the new ones,
//! never a torn file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A file's device and inode (with a fingerprint, its identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    pub dev: u64,
    pub ino: u64,
}

/// Where one file was: its identity and the bytes already turned into events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub dev: u64,
    pub ino: u64,
    pub fingerprint: u64,
    pub fingerprint_len: u64,
    pub offset: u64,
    /// Where it was last seen (for people reading the file).
    pub path: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    version: u32,
    files: Vec<Checkpoint>,
}

/// The positions loaded at start, consumed as files are found again.
#[derive(Debug, Default)]
pub struct Checkpoints {
    by_key: HashMap<FileKey, Checkpoint>,
}

impl Checkpoints {
    pub fn get(&self, key: FileKey) -> Option<&Checkpoint> {
        self.by_key.get(&key)
    }
    pub fn remove(&mut self, key: FileKey) {
        self.by_key.remove(&key);
    }
    pub fn len(&self) -> usize {
        self.by_key.len()
    }
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

/// The state file of one stage.
pub struct StateFile {
    path: PathBuf,
    last: Option<Vec<Checkpoint>>,
}

impl StateFile {
    pub fn new(dir: &Path, stage: &str) -> StateFile {
        StateFile {
            path: dir.join(format!("{stage}.tail.json")),
            last: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Loads the positions; a missing file is a first start, an unreadable
    /// one is reported and treated as a first start (never fatal).
    pub fn load(&self) -> (Checkpoints, Option<String>) {
        let text = match std::fs::read(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return (Checkpoints::default(), None);
            }
            Err(e) => {
                return (
                    Checkpoints::default(),
                    Some(format!("cannot read {}: {e}", self.path.display())),
                );
            }
        };
        match serde_json::from_slice::<Saved>(&text) {
            Ok(saved) => (
                Checkpoints {
                    by_key: saved
                        .files
                        .into_iter()
                        .map(|c| {
                            (
                                FileKey {
                                    dev: c.dev,
                                    ino: c.ino,
                                },
                                c,
                            )
                        })
                        .collect(),
                },
                None,
            ),
            Err(e) => (
                Checkpoints::default(),
                Some(format!(
                    "{} is damaged ({e}); starting without positions",
                    self.path.display()
                )),
            ),
        }
    }

    /// Saves `positions` if they changed since the last save.
    pub fn save(&mut self, positions: Vec<Checkpoint>) -> std::io::Result<()> {
        if self.last.as_ref() == Some(&positions) {
            return Ok(());
        }
        let body = serde_json::to_vec_pretty(&Saved {
            version: 1,
            files: positions.clone(),
        })
        .expect("checkpoints serialize");
        logbus_plugin_api::state::replace_file(&self.path, &body)?;
        self.last = Some(positions);
        Ok(())
    }
}
