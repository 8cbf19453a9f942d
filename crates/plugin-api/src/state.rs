//! Small files a source keeps across restarts (read positions, cursors).
//! A crash must leave either the old content or the new, never a torn
//! file, so every save is written beside the file, synced, and renamed
//! over it.

use std::io::Write;
use std::path::Path;

/// Replaces `path` with `body` atomically (a temporary file in the same
/// directory, `fsync`, rename).
pub fn replace_file(path: &Path, body: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(body)?;
        f.sync_data()?;
    }
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_save_replaces_the_whole_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        replace_file(&path, b"a longer first version").unwrap();
        replace_file(&path, b"short").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"short");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_save_into_a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = replace_file(&dir.path().join("no/such/s.json"), b"x").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    }
}
