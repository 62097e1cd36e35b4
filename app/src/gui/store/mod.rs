//! What the app remembers across restarts: settings, the last model, the window size, every
//! conversation and every speech transcript. Kept as JSON in the platform data dir; every write
//! goes to a temporary file that is synced and then renamed over the old one, so a crash
//! mid-write leaves the previous version intact.

pub mod image;
pub mod speech;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use backpack_engine::load::ReasoningEffort;
use serde::{Deserialize, Serialize};

use image::ImageSettings;
use speech::{SpeechSettings, Transcript};

/// A remote model a conversation talks to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteModelRef {
    pub backend: String,
    pub model: String,
}

impl RemoteModelRef {
    pub fn label(&self) -> String {
        format!("{} · {}", self.model, self.backend)
    }
}

const STATE_FILE: &str = "state.json";
const CONVERSATIONS_FILE: &str = "conversations.json";
const TRANSCRIPTS_FILE: &str = "transcripts.json";
/// How often unsaved changes are flushed while the app runs (also on exit and after answers).
const SAVE_INTERVAL: Duration = Duration::from_secs(2);

/// Sampling settings of one conversation (and the defaults for new ones).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Sampling {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub repeat_penalty: f32,
    pub max_tokens: u32,
    /// None draws a fresh seed for every answer.
    pub seed: Option<u64>,
    /// Reasoning models with a thinking switch (Qwen3) think before answering.
    pub thinking: bool,
    /// How hard models whose template takes it (GPT-OSS) think; None: the template's default.
    pub reasoning_effort: Option<ReasoningEffort>,
}

impl Default for Sampling {
    fn default() -> Self {
        Preset::Balanced.sampling()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    Precise,
    Balanced,
    Creative,
}

impl Preset {
    pub const ALL: [Preset; 3] = [Preset::Precise, Preset::Balanced, Preset::Creative];

    pub fn name(self) -> &'static str {
        match self {
            Preset::Precise => "Precise",
            Preset::Balanced => "Balanced",
            Preset::Creative => "Creative",
        }
    }

    pub fn sampling(self) -> Sampling {
        let (temperature, top_p, top_k, repeat_penalty) = match self {
            // Greedy: the same answer every time.
            Preset::Precise => (0.0, 1.0, 0, 1.0),
            Preset::Balanced => (0.7, 0.9, 40, 1.1),
            Preset::Creative => (1.0, 0.95, 100, 1.05),
        };
        Sampling {
            temperature,
            top_p,
            top_k,
            repeat_penalty,
            max_tokens: 512,
            seed: None,
            thinking: true,
            reasoning_effort: None,
        }
    }

    /// The preset these settings equal, if any (max tokens and seed aside).
    pub fn matching(s: &Sampling) -> Option<Preset> {
        Self::ALL.into_iter().find(|p| {
            let q = p.sampling();
            q.temperature == s.temperature
                && q.top_p == s.top_p
                && q.top_k == s.top_k
                && q.repeat_penalty == s.repeat_penalty
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// Measurements of one answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AnswerStats {
    pub prompt_tokens: usize,
    pub tokens: usize,
    pub ttft_ms: f64,
    pub tokens_per_s: f64,
    /// Why it ended: "end of text", "max tokens", "context full", "stopped".
    pub stop: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<AnswerStats>,
    /// The error that cut this answer short, shown under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Message {
    pub fn user(content: &str) -> Self {
        Self {
            role: Role::User,
            content: content.to_owned(),
            stats: None,
            error: None,
        }
    }

    pub fn assistant() -> Self {
        Self {
            role: Role::Assistant,
            content: String::new(),
            stats: None,
            error: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Conversation {
    pub id: u64,
    pub title: String,
    #[serde(default)]
    pub system_prompt: String,
    /// The model this conversation talks to (loaded when the conversation is opened).
    #[serde(default)]
    pub model: Option<PathBuf>,
    /// Set when the conversation talks to a remote backend's model instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteModelRef>,
    #[serde(default)]
    pub messages: Vec<Message>,
    #[serde(default)]
    pub sampling: Sampling,
    /// Seconds since the Unix epoch.
    #[serde(default)]
    pub created: u64,
    /// Tokens the last answer left in the context (prompt + answer).
    #[serde(default)]
    pub context_used: Option<usize>,
}

impl Conversation {
    pub fn new(id: u64, sampling: Sampling, model: Option<PathBuf>) -> Self {
        Self {
            id,
            title: "New chat".into(),
            system_prompt: String::new(),
            model,
            remote: None,
            messages: Vec::new(),
            sampling,
            created: now_secs(),
            context_used: None,
        }
    }

    /// Case-insensitive match on the title or any message.
    pub fn matches(&self, query: &str) -> bool {
        let q = query.trim().to_lowercase();
        q.is_empty()
            || self.title.to_lowercase().contains(&q)
            || self
                .messages
                .iter()
                .any(|m| m.content.to_lowercase().contains(&q))
    }

    pub fn to_markdown(&self) -> String {
        let mut out = format!("# {}\n\n", self.title);
        if let Some(remote) = &self.remote {
            out += &format!("Model: `{}` (remote)\n\n", remote.label());
        } else if let Some(model) = &self.model {
            out += &format!("Model: `{}`\n\n", model.display());
        }
        if !self.system_prompt.trim().is_empty() {
            out += &format!("**System:** {}\n\n", self.system_prompt.trim());
        }
        for m in &self.messages {
            let who = match m.role {
                Role::User => "User",
                Role::Assistant => "Assistant",
            };
            out += &format!("## {who}\n\n{}\n\n", m.content.trim_end());
            if let Some(s) = &m.stats {
                out += &format!(
                    "_{} tokens · TTFT {:.0} ms · {:.1} tokens/s_\n\n",
                    s.tokens, s.ttft_ms, s.tokens_per_s
                );
            }
        }
        out
    }
}

/// Which panel the left rail shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Panel {
    #[default]
    Chat,
    Speech,
    Image,
    Models,
    Settings,
}

/// How models are loaded (the engine's ModelOptions, as the user picks them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoadSettings {
    /// "f16" or "f32": storage of weights and KV cache.
    pub dtype: String,
    /// None, "q8_0", "q4_0" or "q4_k": quantize safetensors weights while loading.
    pub quant: Option<String>,
    /// Context length to allocate; None = the engine's default (capped by the model).
    pub context: Option<u32>,
    /// Store the KV cache as q8_0 blocks (about half of f16) instead of the storage type.
    pub kv_q8: bool,
    /// Keep f16 copies of block-quantized matrices for prompts (faster prompts, more memory).
    pub f16_prompt_weights: bool,
    /// Speculative decoding's drafts a round; None: off.
    pub speculate: Option<u32>,
    /// The draft model; None drafts from the conversation (prompt lookup).
    pub draft_model: Option<PathBuf>,
}

impl Default for LoadSettings {
    fn default() -> Self {
        Self {
            dtype: "f16".into(),
            quant: None,
            context: None,
            kv_q8: false,
            f16_prompt_weights: false,
            speculate: None,
            draft_model: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AppState {
    pub panel: Panel,
    pub dark_mode: bool,
    pub default_sampling: Sampling,
    pub load: LoadSettings,
    pub last_model: Option<PathBuf>,
    /// Most recent first.
    pub recent_models: Vec<PathBuf>,
    pub selected_conversation: Option<u64>,
    /// Inner size of the window in points.
    pub window_size: Option<[f32; 2]>,
    /// Where downloaded models go (default: `models` in the data dir).
    pub models_dir: Option<PathBuf>,
    /// The speech model and options the Speech panel and chat dictation share.
    pub speech: SpeechSettings,
    /// The image model and the settings of the next image (the Image panel's).
    pub image: ImageSettings,
    /// The port of the server switched on in Settings (default 8080).
    pub server_port: Option<u16>,
}

impl Default for AppState {
    fn default() -> Self {
        Self {
            panel: Panel::Chat,
            dark_mode: true,
            default_sampling: Sampling::default(),
            load: LoadSettings::default(),
            last_model: None,
            recent_models: Vec::new(),
            selected_conversation: None,
            window_size: None,
            models_dir: None,
            speech: SpeechSettings::default(),
            image: ImageSettings::default(),
            server_port: None,
        }
    }
}

impl AppState {
    pub fn remember_model(&mut self, path: &Path) {
        self.recent_models.retain(|p| p != path);
        self.recent_models.insert(0, path.to_owned());
        self.recent_models.truncate(10);
        self.last_model = Some(path.to_owned());
    }
}

/// The persisted data and where it lives.
pub struct Store {
    dir: PathBuf,
    pub state: AppState,
    pub conversations: Vec<Conversation>,
    /// The Speech panel's recordings and transcribed files, oldest first.
    pub transcripts: Vec<Transcript>,
    dirty: bool,
    last_save: Instant,
    /// Problems met while reading the files, for the UI to show once.
    pub notices: Vec<String>,
}

pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The platform data dir (`~/.local/share/backpack` on Linux), or `BACKPACK_DATA_DIR`.
pub fn default_data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BACKPACK_DATA_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    directories::ProjectDirs::from("", "", "backpack")
        .map(|d| d.data_dir().to_owned())
        .unwrap_or_else(|| std::env::temp_dir().join("backpack"))
}

/// Writes `bytes` to `path` so that readers see either the old or the new file, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.{}.tmp", std::process::id()));
    let result = (|| -> Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        // The rename itself is durable once the directory is synced (not possible everywhere).
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.with_context(|| format!("saving {}", path.display()))
}

/// Reads a JSON file; a missing file is the default, an unreadable one is moved aside (not
/// deleted) and reported.
fn read_or_default<T: Default + for<'de> Deserialize<'de>>(
    path: &Path,
    notices: &mut Vec<String>,
) -> T {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return T::default(),
        Err(e) => {
            notices.push(format!("could not read {}: {e}", path.display()));
            return T::default();
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            let aside = path.with_extension(format!("json.unreadable-{}", now_secs()));
            let moved = fs::rename(path, &aside).is_ok();
            notices.push(format!(
                "{} could not be read ({e}){}",
                path.display(),
                if moved {
                    format!("; it was kept as {}", aside.display())
                } else {
                    String::new()
                }
            ));
            T::default()
        }
    }
}

impl Store {
    pub fn open(dir: &Path) -> Self {
        let mut notices = Vec::new();
        let state = read_or_default(&dir.join(STATE_FILE), &mut notices);
        let conversations = read_or_default(&dir.join(CONVERSATIONS_FILE), &mut notices);
        let transcripts = read_or_default(&dir.join(TRANSCRIPTS_FILE), &mut notices);
        Self {
            dir: dir.to_owned(),
            state,
            conversations,
            transcripts,
            dirty: false,
            last_save: Instant::now(),
            notices,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn mark_dirty(&mut self) {
        self.dirty = true;
    }

    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    pub fn save(&mut self) -> Result<()> {
        write_atomic(
            &self.dir.join(STATE_FILE),
            &serde_json::to_vec_pretty(&self.state)?,
        )?;
        write_atomic(
            &self.dir.join(CONVERSATIONS_FILE),
            &serde_json::to_vec_pretty(&self.conversations)?,
        )?;
        // Nobody who never used speech gets the file.
        let transcripts = self.dir.join(TRANSCRIPTS_FILE);
        if !self.transcripts.is_empty() || transcripts.exists() {
            write_atomic(&transcripts, &serde_json::to_vec_pretty(&self.transcripts)?)?;
        }
        self.dirty = false;
        self.last_save = Instant::now();
        Ok(())
    }

    /// Saves if something changed and the last save is a while ago.
    pub fn save_if_due(&mut self) -> Result<()> {
        if self.dirty && self.last_save.elapsed() >= SAVE_INTERVAL {
            self.save()
        } else {
            Ok(())
        }
    }

    pub fn next_conversation_id(&self) -> u64 {
        self.conversations.iter().map(|c| c.id).max().unwrap_or(0) + 1
    }

    pub fn conversation(&self, id: u64) -> Option<&Conversation> {
        self.conversations.iter().find(|c| c.id == id)
    }

    pub fn conversation_mut(&mut self, id: u64) -> Option<&mut Conversation> {
        self.conversations.iter_mut().find(|c| c.id == id)
    }

    pub fn next_transcript_id(&self) -> u64 {
        self.transcripts.iter().map(|t| t.id).max().unwrap_or(0) + 1
    }

    pub fn transcript(&self, id: u64) -> Option<&Transcript> {
        self.transcripts.iter().find(|t| t.id == id)
    }

    pub fn transcript_mut(&mut self, id: u64) -> Option<&mut Transcript> {
        self.transcripts.iter_mut().find(|t| t.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("backpack-store-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn conversations_round_trip() {
        let dir = temp_dir("round-trip");
        let mut store = Store::open(&dir);
        let mut c = Conversation::new(1, Preset::Precise.sampling(), Some("/m".into()));
        c.messages.push(Message::user("hi"));
        c.messages.push(Message {
            stats: Some(AnswerStats {
                prompt_tokens: 5,
                tokens: 2,
                ttft_ms: 3.0,
                tokens_per_s: 10.0,
                stop: "end of text".into(),
            }),
            ..Message::assistant()
        });
        store.conversations.push(c.clone());
        store.state.remember_model(Path::new("/m"));
        store.save().expect("save");
        let again = Store::open(&dir);
        assert_eq!(again.conversations, vec![c]);
        assert_eq!(again.state.last_model.as_deref(), Some(Path::new("/m")));
        assert!(again.notices.is_empty());
        // Only the two files remain: no temporary files are left behind.
        let mut names: Vec<_> = fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["conversations.json", "state.json"]);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn unreadable_file_is_kept_aside_and_reported() {
        let dir = temp_dir("corrupt");
        fs::create_dir_all(&dir).expect("dir");
        fs::write(dir.join(CONVERSATIONS_FILE), b"[{\"id\": 1, \"tit").expect("write");
        let store = Store::open(&dir);
        assert!(store.conversations.is_empty());
        assert_eq!(store.notices.len(), 1, "{:?}", store.notices);
        let kept = fs::read_dir(&dir)
            .expect("dir")
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().contains("unreadable"));
        assert!(kept, "the unreadable file is kept");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn older_state_files_and_transcripts_read() {
        let dir = temp_dir("older");
        fs::create_dir_all(&dir).expect("dir");
        // Written before the Speech panel existed.
        fs::write(
            dir.join(STATE_FILE),
            br#"{"panel": "Models", "dark_mode": false, "recent_models": ["/m"]}"#,
        )
        .expect("write");
        let mut store = Store::open(&dir);
        assert!(store.notices.is_empty(), "{:?}", store.notices);
        assert_eq!(store.state.panel, Panel::Models);
        assert_eq!(store.state.speech, SpeechSettings::default());
        assert!(store.transcripts.is_empty());
        store.state.panel = Panel::Speech;
        let mut t = Transcript::new(1, "Call".into(), speech::Origin::File);
        t.segments.push(speech::Line {
            start: 0.0,
            end: 1.0,
            text: "Hi.".into(),
        });
        store.transcripts.push(t.clone());
        store.save().expect("save");
        let again = Store::open(&dir);
        assert_eq!(again.state.panel, Panel::Speech);
        assert_eq!(again.transcripts, vec![t]);
        // A damaged transcripts file is set aside like a damaged conversations file.
        fs::write(dir.join(TRANSCRIPTS_FILE), b"[{").expect("write");
        let damaged = Store::open(&dir);
        assert!(damaged.transcripts.is_empty());
        assert_eq!(damaged.notices.len(), 1, "{:?}", damaged.notices);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn search_matches_titles_and_messages() {
        let mut c = Conversation::new(1, Sampling::default(), None);
        c.title = "Rust lifetimes".into();
        c.messages.push(Message::user("What is a borrow checker?"));
        assert!(c.matches("rust"));
        assert!(c.matches("BORROW"));
        assert!(c.matches(""));
        assert!(!c.matches("python"));
    }
}
