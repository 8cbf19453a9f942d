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

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(ino: u64, offset: u64) -> Checkpoint {
        Checkpoint {
            dev: 1,
            ino,
            fingerprint: 7,
            fingerprint_len: 10,
            offset,
            path: format!("/var/log/{ino}.log"),
        }
    }

    #[test]
    fn saved_positions_load_back_and_are_taken_one_by_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut state = StateFile::new(dir.path(), "app");
        assert_eq!(state.path(), dir.path().join("app.tail.json"));
        state
            .save(vec![checkpoint(10, 100), checkpoint(11, 5)])
            .unwrap();
        let (mut cps, note) = StateFile::new(dir.path(), "app").load();
        assert_eq!(note, None);
        assert_eq!(cps.len(), 2);
        assert!(!cps.is_empty());
        assert_eq!(
            cps.get(FileKey { dev: 1, ino: 10 }),
            Some(&checkpoint(10, 100))
        );
        cps.remove(FileKey { dev: 1, ino: 10 });
        assert_eq!(cps.get(FileKey { dev: 1, ino: 10 }), None);
        assert_eq!(cps.len(), 1);
        cps.remove(FileKey { dev: 1, ino: 11 });
        assert!(cps.is_empty());
    }

    #[test]
    fn a_missing_file_is_a_first_start_and_others_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let (cps, note) = StateFile::new(dir.path(), "new").load();
        assert!(cps.is_empty());
        assert_eq!(note, None, "a first start is not worth a warning");

        // Unreadable (a directory where the file should be): reported.
        std::fs::create_dir(dir.path().join("dir.tail.json")).unwrap();
        let state = StateFile::new(dir.path(), "dir");
        let (cps, note) = state.load();
        assert!(cps.is_empty());
        let note = note.expect("an unreadable state file is reported");
        assert!(
            note.starts_with(&format!("cannot read {}: ", state.path().display())),
            "{note}"
        );

        // Damaged: reported, naming the file.
        std::fs::write(dir.path().join("bad.tail.json"), b"{\"version\":1,\"fi").unwrap();
        let state = StateFile::new(dir.path(), "bad");
        let (cps, note) = state.load();
        assert!(cps.is_empty());
        let note = note.expect("a damaged state file is reported");
        assert!(
            note.starts_with(&format!("{} is damaged (", state.path().display()))
                && note.ends_with("); starting without positions"),
            "{note}"
        );
    }

    #[test]
    fn unchanged_positions_are_not_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut state = StateFile::new(dir.path(), "app");
        state.save(vec![checkpoint(10, 100)]).unwrap();
        // Replace what is on disk: an unchanged save leaves it alone, a
        // changed one writes.
        std::fs::write(state.path(), b"sentinel").unwrap();
        state.save(vec![checkpoint(10, 100)]).unwrap();
        assert_eq!(std::fs::read(state.path()).unwrap(), b"sentinel");
        state.save(vec![checkpoint(10, 101)]).unwrap();
        let (cps, _) = StateFile::new(dir.path(), "app").load();
        assert_eq!(cps.get(FileKey { dev: 1, ino: 10 }).unwrap().offset, 101);
    }
}
