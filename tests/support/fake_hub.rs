//! A stand-in for the Hugging Face Hub on 127.0.0.1, serving fixture repos through the endpoints
//! Backpack's hub client uses (search, repo info, tree listing, resolve with Range) and the
//! headers the hub sends (ETag, X-Repo-Commit, X-Linked-Etag, X-Linked-Size, Content-Range,
//! X-Error-Code, X-Error-Message, Link), with faults on demand: a dropped connection mid-file,
//! a stall, a corrupted byte, 404, and gated files without a token.
//!
//! Its JSON answers are the hub's recorded answers (tests/conformance/hub/) with only the
//! repo-specific values replaced: every field the real hub sends (`_id`, `id` and `modelId`
//! together, `author`, `cardData`, `config`, `siblings`…) reaches the client as the hub sends
//! it. As on the hub, a gated repo's info and listing are public and its files are not; an
//! unknown repo is a 401 with `X-Error-Code: RepoNotFound` to an anonymous caller; listings
//! come in pages linked by `Link: <…>; rel="next"` when paging is on.

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
    /// Entries per tree page (all in one page when None).
    tree_page: Option<usize>,
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

    /// Lists trees `entries` at a time, each page linking the next.
    pub fn paginate(&self, entries: usize) {
        self.state.lock().expect("state").tree_page = Some(entries.max(1));
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

/// An error as the hub sends it: the cause in `X-Error-Code`, the message in `X-Error-Message`
/// and in the JSON body's `error`.
fn hub_error(conn: &mut TcpStream, status: &str, code: &str, message: &str) {
    respond(
        conn,
        status,
        &[
            (
                "Content-Type".into(),
                "application/json; charset=utf-8".into(),
            ),
            ("X-Error-Code".into(), code.into()),
            ("X-Error-Message".into(), message.into()),
        ],
        serde_json::json!({ "error": message })
            .to_string()
            .as_bytes(),
    );
}

fn conformance(name: &str) -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/conformance/hub")
        .join(name);
    serde_json::from_slice(&std::fs::read(&path).expect("recorded hub answer")).expect("json")
}

/// The hub's recorded model-info answer for gpt2 with this repo's id, commit, gate and files.
fn model_info(repo: &FakeRepo) -> serde_json::Value {
    let mut info = conformance("model_info.json");
    let (author, _) = repo.id.split_once('/').unwrap_or((&repo.id, ""));
    info["id"] = repo.id.clone().into();
    info["modelId"] = repo.id.clone().into();
    info["author"] = author.into();
    info["sha"] = repo.commit.clone().into();
    info["gated"] = if repo.gated {
        serde_json::json!("manual")
    } else {
        serde_json::json!(false)
    };
    info["siblings"] = repo
        .files
        .iter()
        .map(|f| serde_json::json!({ "rfilename": f.path }))
        .collect();
    info
}

/// A recursive listing in the hub's shape: folders as entries of their own, LFS files with
/// their SHA-256 and a xet hash, every entry with its git oid.
fn tree_entries(repo: &FakeRepo) -> Vec<serde_json::Value> {
    let mut entries = Vec::new();
    let mut folders: Vec<&str> = repo
        .files
        .iter()
        .filter_map(|f| f.path.rsplit_once('/').map(|(dir, _)| dir))
        .collect();
    folders.sort_unstable();
    folders.dedup();
    for folder in folders {
        entries.push(serde_json::json!({
            "type": "directory", "oid": git_oid(folder.as_bytes()), "size": 0, "path": folder
        }));
    }
    for f in &repo.files {
        let size = f.listed_size.unwrap_or(f.data.len() as u64);
        let mut e = serde_json::json!({"type": "file", "oid": git_oid(&f.data), "size": size,
            "path": f.path});
        if f.lfs {
            e["lfs"] = serde_json::json!({"oid": sha256_hex(&f.data), "size": size,
                "pointerSize": 134});
            e["xetHash"] = sha256_hex(f.path.as_bytes()).into();
        }
        entries.push(e);
    }
    entries
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
            .map(model_info)
            .collect();
        drop(st);
        json(&mut conn, &serde_json::Value::Array(list));
        return Ok(());
    }
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let segs: Vec<&str> = rest.split('/').collect();
        let id = segs.get(..2).map(|s| s.join("/")).unwrap_or_default();
        let Some(repo) = st.repos.iter().find(|r| r.id == id) else {
            drop(st);
            // The hub does not tell an anonymous caller whether a private repo exists.
            hub_error(
                &mut conn,
                "401 Unauthorized",
                "RepoNotFound",
                "Repository not found",
            );
            return Ok(());
        };
        let revision = segs.get(3).copied().unwrap_or("main");
        if matches!(segs.get(2), Some(&"revision" | &"tree"))
            && revision != "main"
            && revision != repo.commit
        {
            drop(st);
            let message = format!("Invalid rev id: {revision}");
            hub_error(&mut conn, "404 Not Found", "RevisionNotFound", &message);
            return Ok(());
        }
        match segs.get(2) {
            None | Some(&"revision") => {
                let value = model_info(repo);
                drop(st);
                json(&mut conn, &value);
            }
            Some(&"tree") => {
                let entries = tree_entries(repo);
                let per_page = st.tree_page.unwrap_or(usize::MAX);
                let from: usize = query
                    .get("cursor")
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                let to = from.saturating_add(per_page).min(entries.len());
                let page = serde_json::Value::Array(entries[from.min(to)..to].to_vec());
                let mut headers = vec![("Content-Type".to_owned(), "application/json".to_owned())];
                if to < entries.len() {
                    let host = req.headers.get("host").cloned().unwrap_or_default();
                    headers.push((
                        "Link".into(),
                        format!(
                            "<http://{host}/api/models/{}/tree/{}?recursive=1&cursor={to}>; rel=\"next\"",
                            repo.id, revision
                        ),
                    ));
                }
                drop(st);
                respond(&mut conn, "200 OK", &headers, page.to_string().as_bytes());
            }
            _ => {
                drop(st);
                hub_error(&mut conn, "404 Not Found", "EntryNotFound", "Not found");
            }
        }
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
            let anonymous = !req.headers.contains_key("authorization");
            let message = format!(
                "Access to model {} is restricted. You must have access to it and be authenticated to access it. Please log in.",
                repo.id
            );
            drop(st);
            let status = if anonymous {
                "401 Unauthorized"
            } else {
                "403 Forbidden"
            };
            hub_error(&mut conn, status, "GatedRepo", &message);
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
            hub_error(
                &mut conn,
                "404 Not Found",
                "EntryNotFound",
                "Entry not found",
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
