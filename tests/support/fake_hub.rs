//! A stand-in for the Hugging Face Hub on 127.0.0.1, serving fixture repos through the endpoints
//! Backpack's hub client uses (search, repo info, tree listing, resolve with Range) and the
//! headers the hub sends (ETag, X-Repo-Commit, X-Linked-Etag, X-Linked-Size, Content-Range),
//! with faults on demand: a dropped connection mid-file, a stall, a corrupted byte, 404, and
//! 401 for gated repos without a token.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha1::Digest;

pub struct FakeFile {
    pub path: String,
    pub data: Vec<u8>,
    /// Stored with Git LFS (weights): the hub gives its SHA-256.
    pub lfs: bool,
    /// A size for the listing other than the data's (a large model, listed but never fetched).
    pub listed_size: Option<u64>,
}

impl FakeFile {
    pub fn new(path: &str, data: Vec<u8>, lfs: bool) -> Self {
        Self {
            path: path.into(),
            data,
            lfs,
            listed_size: None,
        }
    }
}

pub struct FakeRepo {
    pub id: String,
    pub commit: String,
    pub gated: bool,
    pub files: Vec<FakeFile>,
}

#[derive(Clone, Debug)]
pub enum Fault {
    /// Close the connection after `after` bytes of the body of `file`, `times` times.
    Drop {
        file: String,
        after: usize,
        times: usize,
    },
    /// Send `after` bytes of `file`, then nothing for `pause`, `times` times.
    Stall {
        file: String,
        after: usize,
        pause: Duration,
        times: usize,
    },
    /// Flip byte `offset` of `file` in the next `times` responses that include it.
    Corrupt {
        file: String,
        offset: usize,
        times: usize,
    },
    /// Answer 404 for `file`.
    Missing { file: String },
    /// Send `file` slowly: `chunk` bytes every `every`.
    Slow {
        file: String,
        chunk: usize,
        every: Duration,
    },
}

#[derive(Default)]
struct State {
    repos: Vec<FakeRepo>,
    faults: Vec<Fault>,
    token: Option<String>,
    /// "METHOD path range" of every request, in order.
    log: Vec<String>,
}

pub struct FakeHub {
    pub url: String,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex(&sha2::Sha256::digest(data))
}

pub fn git_oid(data: &[u8]) -> String {
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", data.len()).as_bytes());
    h.update(data);
    hex(&h.finalize())
}

/// Deterministic filler bytes.
pub fn bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

impl FakeHub {
    pub fn start(repos: Vec<FakeRepo>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(Mutex::new(State {
            repos,
            ..Default::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (state.clone(), stop.clone());
        listener.set_nonblocking(true).expect("nonblocking");
        std::thread::spawn(move || {
            while !st.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let s = s.clone();
                        std::thread::spawn(move || {
                            let _ = serve(conn, &s);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self { url, state, stop }
    }

    pub fn fault(&self, fault: Fault) {
        self.state.lock().expect("state").faults.push(fault);
    }

    pub fn clear_faults(&self) {
        self.state.lock().expect("state").faults.clear();
    }

    /// The token gated repos accept.
    pub fn require_token(&self, token: &str) {
        self.state.lock().expect("state").token = Some(token.to_owned());
    }

    pub fn log(&self) -> Vec<String> {
        self.state.lock().expect("state").log.clone()
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

struct Request {
    method: String,
    target: String,
    headers: HashMap<String, String>,
}

fn read_request(conn: &mut TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(conn.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let target = parts.next()?.to_owned();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    Some(Request {
        method,
        target,
        headers,
    })
}

fn respond(conn: &mut TcpStream, status: &str, headers: &[(String, String)], body: &[u8]) {
    let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head += &format!("{k}: {v}\r\n");
    }
    head += &format!("Content-Length: {}\r\n\r\n", body.len());
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(body);
}

fn json(conn: &mut TcpStream, value: &serde_json::Value) {
    respond(
        conn,
        "200 OK",
        &[("Content-Type".into(), "application/json".into())],
        value.to_string().as_bytes(),
    );
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn serve(mut conn: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let Some(req) = read_request(&mut conn) else {
        return Ok(());
    };
    let range = req.headers.get("range").cloned().unwrap_or_default();
    let (path, query) = req
        .target
        .split_once('?')
        .map_or((req.target.as_str(), ""), |(p, q)| (p, q));
    let path = decode(path);
    let query: HashMap<String, String> = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), decode(v)))
        .collect();
    let mut st = state.lock().expect("state");
    st.log.push(
        format!("{} {} {}", req.method, path, range)
            .trim_end()
            .to_owned(),
    );
    let authorized = |st: &State| {
        st.token.as_ref().is_none_or(|t| {
            req.headers.get("authorization").map(String::as_str) == Some(&format!("Bearer {t}"))
        })
    };

    // GET /api/models?search=…
    if path == "/api/models" {
        let needle = query
            .get("search")
            .cloned()
            .unwrap_or_default()
            .to_lowercase();
        let list: Vec<serde_json::Value> = st
            .repos
            .iter()
            .filter(|r| r.id.to_lowercase().contains(&needle))
            .map(|r| {
                serde_json::json!({"id": r.id, "_id": r.commit, "downloads": 1000, "likes": 10,
                    "pipeline_tag": "text-generation", "gated": if r.gated { serde_json::json!("manual") } else { serde_json::json!(false) }})
            })
            .collect();
        drop(st);
        json(&mut conn, &serde_json::Value::Array(list));
        return Ok(());
    }
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let segs: Vec<&str> = rest.split('/').collect();
        if segs.len() < 2 {
            drop(st);
            respond(&mut conn, "404 Not Found", &[], b"{}");
            return Ok(());
        }
        let id = format!("{}/{}", segs[0], segs[1]);
        let Some(repo) = st.repos.iter().find(|r| r.id == id) else {
            drop(st);
            respond(
                &mut conn,
                "404 Not Found",
                &[("X-Error-Code".into(), "RepoNotFound".into())],
                b"{\"error\":\"Repository not found\"}",
            );
            return Ok(());
        };
        if repo.gated && !authorized(&st) {
            drop(st);
            respond(
                &mut conn,
                "401 Unauthorized",
                &[],
                b"{\"error\":\"Access to this repo is restricted\"}",
            );
            return Ok(());
        }
        let gated = if repo.gated {
            serde_json::json!("manual")
        } else {
            serde_json::json!(false)
        };
        let value = match segs.get(2) {
            None | Some(&"revision") => serde_json::json!({
                "id": repo.id, "_id": repo.commit, "sha": repo.commit, "gated": gated, "private": false,
                "siblings": repo.files.iter().map(|f| serde_json::json!({"rfilename": f.path})).collect::<Vec<_>>(),
            }),
            Some(&"tree") => serde_json::Value::Array(
                repo.files
                    .iter()
                    .map(|f| {
                        let size = f.listed_size.unwrap_or(f.data.len() as u64);
                        let mut e = serde_json::json!({"type": "file", "path": f.path,
                            "size": size, "oid": git_oid(&f.data)});
                        if f.lfs {
                            e["lfs"] = serde_json::json!({"oid": sha256_hex(&f.data),
                                "size": size, "pointerSize": 134});
                        }
                        e
                    })
                    .collect(),
            ),
            _ => serde_json::json!({}),
        };
        drop(st);
        json(&mut conn, &value);
        return Ok(());
    }
    // GET|HEAD /{owner}/{name}/resolve/{rev}/{file}
    let segs: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    if segs.len() == 5 && segs[2] == "resolve" {
        let id = format!("{}/{}", segs[0], segs[1]);
        let file_path = segs[4].to_owned();
        let Some(repo) = st.repos.iter().find(|r| r.id == id) else {
            drop(st);
            respond(&mut conn, "404 Not Found", &[], b"not found");
            return Ok(());
        };
        if repo.gated && !authorized(&st) {
            drop(st);
            respond(&mut conn, "401 Unauthorized", &[], b"gated");
            return Ok(());
        }
        let missing = st
            .faults
            .iter()
            .any(|f| matches!(f, Fault::Missing { file } if *file == file_path));
        let Some(file) = repo
            .files
            .iter()
            .find(|f| f.path == file_path)
            .filter(|_| !missing)
        else {
            drop(st);
            respond(
                &mut conn,
                "404 Not Found",
                &[("X-Error-Code".into(), "EntryNotFound".into())],
                b"not found",
            );
            return Ok(());
        };
        let mut data = file.data.clone();
        let etag = if file.lfs {
            sha256_hex(&data)
        } else {
            git_oid(&data)
        };
        let commit = repo.commit.clone();
        let total = data.len();
        let start = range
            .strip_prefix("bytes=")
            .and_then(|r| r.split('-').next())
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|&s| s < total);
        let mut headers = vec![
            ("ETag".to_owned(), format!("\"{etag}\"")),
            ("X-Repo-Commit".to_owned(), commit),
            ("X-Linked-Etag".to_owned(), format!("\"{etag}\"")),
            ("X-Linked-Size".to_owned(), total.to_string()),
            ("Accept-Ranges".to_owned(), "bytes".to_owned()),
        ];
        let from = start.unwrap_or(0);
        let status = if let Some(s) = start {
            headers.push((
                "Content-Range".into(),
                format!("bytes {s}-{}/{total}", total - 1),
            ));
            "206 Partial Content"
        } else {
            "200 OK"
        };
        // Faults that apply to this response.
        let mut drop_at = None;
        let mut stall = None;
        let mut slow = None;
        for f in st.faults.iter_mut() {
            match f {
                Fault::Corrupt {
                    file,
                    offset,
                    times,
                } if *file == file_path && *times > 0 && *offset >= from && *offset < total => {
                    data[*offset] ^= 0xFF;
                    *times -= 1;
                }
                Fault::Drop { file, after, times } if *file == file_path && *times > 0 => {
                    drop_at = Some(*after);
                    *times -= 1;
                }
                Fault::Stall {
                    file,
                    after,
                    pause,
                    times,
                } if *file == file_path && *times > 0 => {
                    stall = Some((*after, *pause));
                    *times -= 1;
                }
                Fault::Slow { file, chunk, every } if *file == file_path => {
                    slow = Some((*chunk, *every));
                }
                _ => {}
            }
        }
        drop(st);
        let body = &data[from..];
        let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
        for (k, v) in &headers {
            head += &format!("{k}: {v}\r\n");
        }
        head += &format!("Content-Length: {}\r\n\r\n", body.len());
        conn.write_all(head.as_bytes())?;
        if req.method == "HEAD" {
            return Ok(());
        }
        if let Some(after) = drop_at {
            let n = after.min(body.len());
            conn.write_all(&body[..n])?;
            conn.flush()?;
            let _ = conn.shutdown(std::net::Shutdown::Both);
            return Ok(());
        }
        if let Some((after, pause)) = stall {
            let n = after.min(body.len());
            conn.write_all(&body[..n])?;
            conn.flush()?;
            std::thread::sleep(pause);
            conn.write_all(&body[n..])?;
            return Ok(());
        }
        if let Some((chunk, every)) = slow {
            for part in body.chunks(chunk.max(1)) {
                conn.write_all(part)?;
                conn.flush()?;
                std::thread::sleep(every);
            }
            return Ok(());
        }
        conn.write_all(body)?;
        // Drain anything left so the client sees a clean close.
        let _ = conn.set_read_timeout(Some(Duration::from_millis(1)));
        let _ = conn.read(&mut [0u8; 16]);
        return Ok(());
    }
    drop(st);
    respond(&mut conn, "404 Not Found", &[], b"not found");
    Ok(())
}
