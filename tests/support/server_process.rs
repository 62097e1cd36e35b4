//! `backpack serve` as a child process on a free loopback port, for the server's tests.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn fixture(model: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/models")
        .join(model)
}

/// A copy of a fixture whose config allows 2,048 positions (its random weights read any
/// position alike): prompts with tool definitions outgrow the fixtures' 256. Removed when
/// dropped.
pub struct LongContext(pub PathBuf);

impl LongContext {
    pub fn of(model: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("backpack-long-{model}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        for entry in std::fs::read_dir(fixture(model)).expect("fixture") {
            let path = entry.expect("entry").path();
            std::fs::copy(&path, dir.join(path.file_name().expect("name"))).expect("copy");
        }
        let config = dir.join("config.json");
        let mut value: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&config).expect("config")).expect("json");
        value["max_position_embeddings"] = 2048.into();
        std::fs::write(&config, value.to_string()).expect("write");
        Self(dir)
    }

    pub fn path(&self) -> &str {
        self.0.to_str().expect("utf-8")
    }
}

impl Drop for LongContext {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `backpack serve`, killed when dropped.
pub struct ServerProcess {
    child: Child,
    pub base: String,
    pub address_line: String,
    /// The server's later log lines.
    pub log: std::sync::mpsc::Receiver<String>,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the server on a free port with the tiny Qwen2 and waits for its address line.
pub fn start(extra: &[&str]) -> ServerProcess {
    let model = fixture("tiny-qwen2");
    let mut args = vec!["--model", model.to_str().expect("utf-8")];
    args.extend(extra);
    start_with(&args)
}

pub fn start_with(extra: &[&str]) -> ServerProcess {
    let mut child = Command::new(env!("CARGO_BIN_EXE_backpack"))
        .args(["serve", "--port", "0"])
        .args(extra)
        .env_remove("BACKPACK_API_KEY")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("backpack serve starts");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // Owned from here on, so the process is killed even if the wait below fails.
    let mut server = ServerProcess {
        child,
        base: String::new(),
        address_line: String::new(),
        log: rx,
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let line = server
            .log
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the server prints its address");
        if let Some(at) = line.find("http://") {
            let url = line[at..].split_whitespace().next().expect("url");
            server.base = url.trim_end_matches("/v1").to_owned();
            server.address_line = line;
            return server;
        }
    }
}
