//! Turning a conversation into what the engine takes, and the names derived from it.

use backpack_engine::load::ChatMessage;
use backpack_engine::models::{GenerateParams, Prompt};
use backpack_engine::ops::SamplerParams;
use backpack_engine::remote::ChatParams;

use crate::gui::store::{Conversation, Role, Sampling};

/// The prompt for a conversation: its system prompt and messages through the model's chat
/// template, or a plain transcript for models without one.
pub fn prompt_for(conv: &Conversation, chat_template: bool) -> Prompt {
    let mut messages = Vec::new();
    if !conv.system_prompt.trim().is_empty() {
        messages.push(ChatMessage::new("system", conv.system_prompt.trim()));
    }
    for m in &conv.messages {
        messages.push(ChatMessage::new(m.role.as_str(), &m.content));
    }
    if chat_template {
        return Prompt::Chat(messages);
    }
    let mut text = String::new();
    for m in &messages {
        let who = match m.role.as_str() {
            "system" => "System",
            "user" => "User",
            _ => "Assistant",
        };
        text += &format!("{who}: {}\n", m.content);
    }
    text += "Assistant:";
    Prompt::Raw(text)
}

/// The engine's parameters for a conversation's sampling settings; without a fixed seed each
/// answer draws a new one.
pub fn generate_params(s: &Sampling) -> GenerateParams {
    let seed = s.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    GenerateParams {
        max_tokens: s.max_tokens.max(1),
        sampler: SamplerParams {
            temperature: s.temperature,
            top_k: s.top_k,
            top_p: s.top_p,
            repeat_penalty: s.repeat_penalty,
            seed,
        },
        // Said both ways: Qwen3's templates think unless told not to, the small Qwen3.5
        // models' only when told to.
        thinking: Some(s.thinking),
        reasoning_effort: s.reasoning_effort,
        ..GenerateParams::default()
    }
}

/// A conversation's sampling as a remote server takes it (top-k 0 and repeat penalty 1 mean
/// "off" and are not sent; the server keeps its own seed unless one is fixed).
pub fn remote_params(s: &Sampling) -> ChatParams {
    ChatParams {
        max_tokens: Some(s.max_tokens.max(1)),
        temperature: Some(s.temperature),
        top_p: Some(s.top_p),
        top_k: Some(s.top_k).filter(|&k| k > 0),
        repeat_penalty: Some(s.repeat_penalty).filter(|&r| r != 1.0),
        thinking: (!s.thinking).then_some(false),
        seed: s.seed,
        stop: Vec::new(),
    }
}

/// Removes the oldest exchange (everything before the second user message). False when only
/// one user message is left.
pub fn drop_oldest_turn(conv: Option<&mut Conversation>) -> bool {
    let Some(conv) = conv else { return false };
    let second_user = conv
        .messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == Role::User)
        .nth(1)
        .map(|(i, _)| i);
    match second_user {
        Some(i) => {
            conv.messages.drain(..i);
            true
        }
        None => false,
    }
}

pub fn title_from(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default().trim();
    let mut title: String = line.chars().take(40).collect();
    if line.chars().count() > 40 {
        title.push('…');
    }
    if title.is_empty() {
        "New chat".into()
    } else {
        title
    }
}

pub fn file_stem_for(title: &str) -> String {
    let stem: String = title
        .chars()
        .map(|c| if c.is_alphanumeric() { c } else { '-' })
        .collect();
    let stem = stem.trim_matches('-').to_owned();
    if stem.is_empty() { "chat".into() } else { stem }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gui::store::{Message, Sampling};

    #[test]
    fn the_thinking_switch_reaches_the_template_both_ways() {
        let mut s = Sampling::default();
        assert!(s.thinking);
        assert_eq!(generate_params(&s).thinking, Some(true));
        s.thinking = false;
        assert_eq!(generate_params(&s).thinking, Some(false));
    }

    #[test]
    fn oldest_turns_are_dropped_until_one_user_message_is_left() {
        let mut c = Conversation::new(1, Sampling::default(), None);
        for text in ["a", "b", "c"] {
            c.messages.push(Message::user(text));
            c.messages.push(Message::assistant());
        }
        c.messages.pop();
        assert!(drop_oldest_turn(Some(&mut c)));
        assert_eq!(c.messages.len(), 3);
        assert_eq!(c.messages[0].content, "b");
        assert!(drop_oldest_turn(Some(&mut c)));
        assert_eq!(c.messages.len(), 1);
        assert!(!drop_oldest_turn(Some(&mut c)));
    }

    #[test]
    fn prompts_use_the_template_or_a_plain_transcript() {
        let mut c = Conversation::new(1, Sampling::default(), None);
        c.system_prompt = "Be brief.".into();
        c.messages.push(Message::user("Hi"));
        match prompt_for(&c, true) {
            Prompt::Chat(m) => {
                assert_eq!(m.len(), 2);
                assert_eq!(m[0].role, "system");
            }
            _ => panic!("chat prompt expected"),
        }
        match prompt_for(&c, false) {
            Prompt::Raw(t) => assert_eq!(t, "System: Be brief.\nUser: Hi\nAssistant:"),
            _ => panic!("raw prompt expected"),
        }
    }

    #[test]
    fn titles_are_short_first_lines() {
        assert_eq!(title_from("Hello\nworld"), "Hello");
        assert_eq!(title_from(&"x".repeat(50)).chars().count(), 41);
        assert_eq!(file_stem_for("What's up?"), "What-s-up");
    }
}
