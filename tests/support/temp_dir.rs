//! Temporary folders for tests that write files, removed when dropped.

use std::path::{Path, PathBuf};

/// A fresh folder under the system's temporary directory, removed with everything in it when
/// dropped (also when the test fails).
pub struct TempDir(PathBuf);

impl TempDir {
    /// `backpack-NAME-PID-N`: unique per process and call, so parallel tests never share one.
    pub fn new(name: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("backpack-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies the folder `src` into `dst` (made if missing), subfolders included.
#[allow(dead_code)] // Each test binary that includes this file uses what it needs.
pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).expect("mkdir");
    for entry in std::fs::read_dir(src).expect("read dir") {
        let path = entry.expect("entry").path();
        let to = dst.join(path.file_name().expect("name"));
        if path.is_dir() {
            copy_dir(&path, &to);
        } else {
            std::fs::copy(&path, &to).expect("copy");
        }
    }
}
