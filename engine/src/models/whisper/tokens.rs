//! Whisper's special tokens, found by name in the tokenizer where `generation_config.json`
//! does not list them, and the languages the multilingual models know.

use crate::Error;
use crate::load::TextTokenizer;

use super::config::{WhisperConfig, WhisperGeneration};

/// Whisper's language codes and names, in the order of its language tokens.
pub const LANGUAGES: [(&str, &str); 100] = [
    ("en", "english"),
    ("zh", "chinese"),
    ("de", "german"),
    ("es", "spanish"),
    ("ru", "russian"),
    ("ko", "korean"),
    ("fr", "french"),
    ("ja", "japanese"),
    ("pt", "portuguese"),
    ("tr", "turkish"),
    ("pl", "polish"),
    ("ca", "catalan"),
    ("nl", "dutch"),
    ("ar", "arabic"),
    ("sv", "swedish"),
    ("it", "italian"),
    ("id", "indonesian"),
    ("hi", "hindi"),
    ("fi", "finnish"),
    ("vi", "vietnamese"),
    ("he", "hebrew"),
    ("uk", "ukrainian"),
    ("el", "greek"),
    ("ms", "malay"),
    ("cs", "czech"),
    ("ro", "romanian"),
    ("da", "danish"),
    ("hu", "hungarian"),
    ("ta", "tamil"),
    ("no", "norwegian"),
    ("th", "thai"),
    ("ur", "urdu"),
    ("hr", "croatian"),
    ("bg", "bulgarian"),
    ("lt", "lithuanian"),
    ("la", "latin"),
    ("mi", "maori"),
    ("ml", "malayalam"),
    ("cy", "welsh"),
    ("sk", "slovak"),
    ("te", "telugu"),
    ("fa", "persian"),
    ("lv", "latvian"),
    ("bn", "bengali"),
    ("sr", "serbian"),
    ("az", "azerbaijani"),
    ("sl", "slovenian"),
    ("kn", "kannada"),
    ("et", "estonian"),
    ("mk", "macedonian"),
    ("br", "breton"),
    ("eu", "basque"),
    ("is", "icelandic"),
    ("hy", "armenian"),
    ("ne", "nepali"),
    ("mn", "mongolian"),
    ("bs", "bosnian"),
    ("kk", "kazakh"),
    ("sq", "albanian"),
    ("sw", "swahili"),
    ("gl", "galician"),
    ("mr", "marathi"),
    ("pa", "punjabi"),
    ("si", "sinhala"),
    ("km", "khmer"),
    ("sn", "shona"),
    ("yo", "yoruba"),
    ("so", "somali"),
    ("af", "afrikaans"),
    ("oc", "occitan"),
    ("ka", "georgian"),
    ("be", "belarusian"),
    ("tg", "tajik"),
    ("sd", "sindhi"),
    ("gu", "gujarati"),
    ("am", "amharic"),
    ("yi", "yiddish"),
    ("lo", "lao"),
    ("uz", "uzbek"),
    ("fo", "faroese"),
    ("ht", "haitian creole"),
    ("ps", "pashto"),
    ("tk", "turkmen"),
    ("nn", "nynorsk"),
    ("mt", "maltese"),
    ("sa", "sanskrit"),
    ("lb", "luxembourgish"),
    ("my", "myanmar"),
    ("bo", "tibetan"),
    ("tl", "tagalog"),
    ("mg", "malagasy"),
    ("as", "assamese"),
    ("tt", "tatar"),
    ("haw", "hawaiian"),
    ("ln", "lingala"),
    ("ha", "hausa"),
    ("ba", "bashkir"),
    ("jw", "javanese"),
    ("su", "sundanese"),
    ("yue", "cantonese"),
];

/// A language code from a code (`fr`), a name (`French`) or a token (`<|fr|>`).
pub fn language_code(input: &str) -> Option<&'static str> {
    let s = input.trim().to_lowercase();
    let s = s
        .strip_prefix("<|")
        .and_then(|r| r.strip_suffix("|>"))
        .unwrap_or(&s);
    LANGUAGES
        .iter()
        .find(|(code, name)| *code == s || *name == s)
        .map(|(code, _)| *code)
}

/// What the decoder is asked to do with the speech.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Task {
    #[default]
    Transcribe,
    /// Into English.
    Translate,
}

impl Task {
    pub fn name(self) -> &'static str {
        match self {
            Self::Transcribe => "transcribe",
            Self::Translate => "translate",
        }
    }
}

/// The special token ids one Whisper checkpoint uses.
#[derive(Clone, Debug)]
pub struct SpecialTokens {
    pub vocab: u32,
    pub sot: u32,
    pub eot: u32,
    pub transcribe: Option<u32>,
    pub translate: Option<u32>,
    pub start_of_prev: Option<u32>,
    pub no_speech: Option<u32>,
    pub no_timestamps: u32,
    /// `<|0.00|>`; every id from here up is a timestamp, 0.02 s apart.
    pub timestamp_begin: u32,
    /// (code, id) of every language token.
    pub languages: Vec<(&'static str, u32)>,
    /// Takes language and task tokens in its prompt.
    pub multilingual: bool,
}

/// Whether a model without `is_multilingual` (CTranslate2 and other conversions, older exports)
/// takes language and task tokens. English-only tokenizers list the language tokens too, so
/// their presence says nothing: as openai-whisper and whisper.cpp do, a vocabulary of 51,865
/// or more is multilingual and the English-only one has 51,864. Smaller, non-standard
/// vocabularies go by whether they have language tokens at all.
pub fn multilingual_by_vocab(vocab: u32, languages: &[(&str, u32)]) -> bool {
    const ENGLISH_ONLY_VOCAB: u32 = 51_864;
    if vocab >= ENGLISH_ONLY_VOCAB {
        vocab > ENGLISH_ONLY_VOCAB
    } else {
        !languages.is_empty()
    }
}

impl SpecialTokens {
    pub fn resolve(
        config: &WhisperConfig,
        generation: &WhisperGeneration,
        tokenizer: &TextTokenizer,
    ) -> Result<Self, Error> {
        let named = |name: &str| tokenizer.token_to_id(name);
        let required = |value: Option<u32>, name: &str| {
            value.ok_or_else(|| {
                Error::Invalid(format!(
                    "the tokenizer has no {name} token, so this is not a Whisper tokenizer"
                ))
            })
        };
        let sot = required(
            generation
                .decoder_start_token_id
                .or(config.decoder_start_token_id)
                .or_else(|| named("<|startoftranscript|>")),
            "<|startoftranscript|>",
        )?;
        let eot = required(
            named("<|endoftext|>")
                .or(generation.eos_token_id)
                .or(config.eos_token_id),
            "<|endoftext|>",
        )?;
        let no_timestamps = required(
            generation
                .no_timestamps_token_id
                .or_else(|| named("<|notimestamps|>")),
            "<|notimestamps|>",
        )?;
        let mut languages: Vec<(&'static str, u32)> = if generation.lang_to_id.is_empty() {
            LANGUAGES
                .iter()
                .filter_map(|(code, _)| Some((*code, named(&format!("<|{code}|>"))?)))
                .collect()
        } else {
            generation
                .lang_to_id
                .iter()
                .filter_map(|(token, &id)| Some((language_code(token)?, id)))
                .collect()
        };
        languages.retain(|&(_, id)| id < config.vocab);
        languages.sort_by_key(|&(_, id)| id);
        let task = |name: &str| {
            generation
                .task_to_id
                .get(name)
                .copied()
                .or_else(|| named(&format!("<|{name}|>")))
        };
        let multilingual = generation
            .is_multilingual
            .unwrap_or_else(|| multilingual_by_vocab(config.vocab, &languages));
        let tokens = Self {
            vocab: config.vocab,
            sot,
            eot,
            transcribe: task("transcribe"),
            translate: task("translate"),
            start_of_prev: generation
                .prev_sot_token_id
                .or_else(|| named("<|startofprev|>")),
            no_speech: named("<|nospeech|>").or_else(|| named("<|nocaptions|>")),
            no_timestamps,
            timestamp_begin: no_timestamps + 1,
            languages,
            multilingual,
        };
        if tokens.timestamp_begin >= config.vocab || sot >= config.vocab || eot >= config.vocab {
            return Err(Error::Invalid(format!(
                "the special tokens (<|startoftranscript|> {sot}, <|endoftext|> {eot}, <|notimestamps|> {no_timestamps}) do not fit the model's vocabulary of {}",
                config.vocab
            )));
        }
        Ok(tokens)
    }

    /// Token ids for a model with random weights and no tokenizer (benchmarks): the usual
    /// layout, with the 1501 timestamps at the end of the vocabulary.
    pub fn synthetic(vocab: u32) -> Self {
        let timestamp_begin = vocab.saturating_sub(1501).max(8);
        Self {
            vocab,
            sot: 1,
            eot: 0,
            transcribe: Some(2),
            translate: Some(3),
            start_of_prev: Some(4),
            no_speech: Some(5),
            no_timestamps: timestamp_begin - 1,
            timestamp_begin,
            languages: Vec::new(),
            multilingual: false,
        }
    }

    pub fn is_timestamp(&self, id: u32) -> bool {
        id >= self.timestamp_begin
    }

    pub fn language_id(&self, code: &str) -> Option<u32> {
        self.languages
            .iter()
            .find(|(c, _)| *c == code)
            .map(|&(_, id)| id)
    }

    pub fn language_of(&self, id: u32) -> Option<&'static str> {
        self.languages
            .iter()
            .find(|&&(_, i)| i == id)
            .map(|&(c, _)| c)
    }

    /// The decoder prompt: `<|startoftranscript|>`, then language and task for multilingual
    /// models, then `<|notimestamps|>` unless timestamps are wanted.
    pub fn prompt(&self, language: Option<&str>, task: Task, timestamps: bool) -> Vec<u32> {
        let mut ids = vec![self.sot];
        if self.multilingual {
            if let Some(id) = language.and_then(|l| self.language_id(l)) {
                ids.push(id);
            }
            let task_id = match task {
                Task::Transcribe => self.transcribe,
                Task::Translate => self.translate,
            };
            ids.extend(task_id);
        }
        if !timestamps {
            ids.push(self.no_timestamps);
        }
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::multilingual_by_vocab;

    #[test]
    fn the_vocabulary_size_decides_as_in_openai_whisper() {
        let listed = [("en", 50_259), ("de", 50_261)];
        // tiny.en … medium.en: the language tokens are listed, the model is English-only.
        assert!(!multilingual_by_vocab(51_864, &listed));
        // tiny … large-v2, and large-v3's 51,866.
        assert!(multilingual_by_vocab(51_865, &listed));
        assert!(multilingual_by_vocab(51_866, &listed));
        // Non-standard small vocabularies go by their tokens.
        assert!(multilingual_by_vocab(2_608, &listed));
        assert!(!multilingual_by_vocab(2_608, &[]));
    }
}
