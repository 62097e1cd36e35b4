//! Remote transcription (`POST /audio/transcriptions` and `/audio/translations`, multipart) and
//! image generation (`POST /images/generations`).

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{RemoteClient, RemoteError, bad};

/// An audio file to transcribe remotely.
#[derive(Clone, Debug, Default)]
pub struct RemoteAudio {
    pub bytes: Vec<u8>,
    pub file_name: String,
    /// A language code; None lets the server detect it.
    pub language: Option<String>,
    pub prompt: Option<String>,
    pub temperature: Option<f32>,
    /// Translate to English instead of transcribing.
    pub translate: bool,
    /// Backpack's extension: at most this many tokens per 30 s window (sent only when set).
    pub max_new_tokens: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct RemoteSegment {
    pub start: f64,
    pub end: f64,
    pub text: String,
}

/// What came back: the text, and timings when the server gives them.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct RemoteTranscript {
    pub text: String,
    #[serde(default)]
    pub language: Option<String>,
    /// Seconds of audio.
    #[serde(default)]
    pub duration: Option<f64>,
    #[serde(default)]
    pub segments: Vec<RemoteSegment>,
}

/// An image request; the extensions (negative prompt, steps, guidance, seed) are sent only to
/// endpoints that take them.
#[derive(Clone, Debug, Default)]
pub struct RemoteImageRequest {
    pub prompt: String,
    pub negative: Option<String>,
    pub n: u32,
    pub size: Option<(u32, u32)>,
    pub steps: Option<u32>,
    pub guidance: Option<f32>,
    pub seed: Option<u64>,
}

impl RemoteClient {
    /// Transcribes (or translates) `audio` with `model`, asking for segment timings
    /// (`verbose_json`) and settling for plain `json` where the server refuses them.
    pub async fn transcribe(
        &self,
        model: &str,
        audio: &RemoteAudio,
    ) -> Result<RemoteTranscript, RemoteError> {
        match self.transcribe_as(model, audio, "verbose_json").await {
            Err(RemoteError::Http { status: 400, .. }) => {
                self.transcribe_as(model, audio, "json").await
            }
            other => other,
        }
    }

    async fn transcribe_as(
        &self,
        model: &str,
        audio: &RemoteAudio,
        format: &str,
    ) -> Result<RemoteTranscript, RemoteError> {
        use reqwest::multipart::{Form, Part};
        let path = if audio.translate {
            "audio/translations"
        } else {
            "audio/transcriptions"
        };
        let url = self.endpoint.url(path);
        let file = Part::bytes(audio.bytes.clone()).file_name(audio.file_name.clone());
        let mut form = Form::new()
            .part("file", file)
            .text("model", model.to_owned())
            .text("response_format", format.to_owned());
        if let Some(language) = &audio.language {
            form = form.text("language", language.clone());
        }
        if let Some(prompt) = &audio.prompt {
            form = form.text("prompt", prompt.clone());
        }
        if let Some(t) = audio.temperature {
            form = form.text("temperature", t.to_string());
        }
        if let Some(n) = audio.max_new_tokens {
            form = form.text("max_new_tokens", n.to_string());
        }
        let response = self
            .send(self.http.post(&url).multipart(form), &url)
            .await?;
        let body = self.body(response, &url).await?;
        serde_json::from_slice(&body).map_err(|e| bad(&url, &e))
    }

    /// Generates `request.n` images with `model`; returns each as its encoded file (PNG from
    /// most servers), fetched when the server answers with URLs.
    pub async fn images(
        &self,
        model: &str,
        request: &RemoteImageRequest,
    ) -> Result<Vec<Vec<u8>>, RemoteError> {
        let url = self.endpoint.url("images/generations");
        let mut body = json!({"model": model, "prompt": request.prompt, "n": request.n.max(1)});
        let fields = body.as_object_mut().expect("a JSON object");
        if let Some((w, h)) = request.size {
            fields.insert("size".into(), json!(format!("{w}x{h}")));
        }
        if self.endpoint.extensions {
            // OpenAI's newer models refuse response_format (and answer base64 anyway).
            fields.insert("response_format".into(), json!("b64_json"));
            let extras = [
                (
                    "negative_prompt",
                    request.negative.as_ref().map(|v| json!(v)),
                ),
                ("steps", request.steps.map(|v| json!(v))),
                ("guidance_scale", request.guidance.map(|v| json!(v))),
                ("seed", request.seed.map(|v| json!(v))),
            ];
            for (key, value) in extras {
                if let Some(v) = value {
                    fields.insert(key.into(), v);
                }
            }
        }
        let response = self.send(self.http.post(&url).json(&body), &url).await?;
        let body = self.body(response, &url).await?;
        #[derive(Deserialize)]
        struct Answer {
            data: Vec<Value>,
        }
        let answer: Answer = serde_json::from_slice(&body).map_err(|e| bad(&url, &e))?;
        let mut images = Vec::with_capacity(answer.data.len());
        for item in answer.data {
            if let Some(b64) = item.get("b64_json").and_then(Value::as_str) {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map_err(|e| bad(&url, &format!("b64_json is not base64 ({e})")))?;
                images.push(bytes);
            } else if let Some(link) = item.get("url").and_then(Value::as_str) {
                images.push(self.fetch_image(link).await?);
            } else {
                return Err(bad(&url, &"an image without b64_json or url"));
            }
        }
        if images.is_empty() {
            return Err(bad(&url, &"no images in the answer"));
        }
        Ok(images)
    }

    /// An image the server hosts elsewhere; the API key is not sent along (the link may be
    /// another host's, and carries its own signature).
    async fn fetch_image(&self, link: &str) -> Result<Vec<u8>, RemoteError> {
        let response = match self.http.get(link).send().await {
            Ok(r) => r,
            Err(e) => return Err(super::send_error(link, &e)),
        };
        if !response.status().is_success() {
            return Err(RemoteError::Http {
                url: link.to_owned(),
                status: response.status().as_u16(),
                message: "the image could not be fetched".into(),
            });
        }
        self.body(response, link).await
    }
}
