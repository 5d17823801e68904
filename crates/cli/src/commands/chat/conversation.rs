//! The conversation so far and how it is made to fit the context.
//!
//! Each turn the whole conversation is rendered with the chat template and
//! tokenized again (the template may format earlier turns differently once
//! more follow). When the prompt and the room kept for the reply do not fit,
//! the oldest exchanges (a user message and the replies after it) are
//! dropped for good, the system prompt never; if the newest message alone
//! does not fit, nothing is dropped and the caller refuses the message.

use chat::{ChatTemplate, Message};

#[derive(Debug)]
pub struct Conversation {
    system: Option<String>,
    /// User and assistant messages, oldest first, starting with a user one.
    turns: Vec<Message>,
}

/// The prompt for the next reply.
#[derive(Debug)]
pub struct Prompt {
    pub text: String,
    pub tokens: Vec<u32>,
    /// Exchanges dropped from the front to make it fit.
    pub dropped: usize,
}

#[derive(Debug)]
pub enum Fit {
    Fits(Prompt),
    /// Even with every earlier exchange dropped, the prompt is `tokens`
    /// long, which leaves no room in the context.
    TooLong {
        tokens: usize,
    },
}

impl Conversation {
    pub fn new(system: Option<String>) -> Conversation {
        Conversation {
            system,
            turns: Vec::new(),
        }
    }

    /// Back to the system prompt alone.
    pub fn clear(&mut self) {
        self.turns.clear();
    }

    pub fn push_user(&mut self, text: String) {
        self.turns.push(Message::user(text));
    }

    pub fn push_assistant(&mut self, text: String) {
        self.turns.push(Message::assistant(text));
    }

    /// Take back the last message (a user message that got no reply).
    pub fn pop(&mut self) {
        self.turns.pop();
    }

    /// The conversation as `/save` writes it: OpenAI's
    /// `{"messages": [{"role": .., "content": ..}]}`, the system prompt
    /// (when there is one) first.
    pub fn to_json(&self) -> serde_json::Value {
        let messages: Vec<_> = self
            .messages(0)
            .iter()
            .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
            .collect();
        serde_json::json!({ "messages": messages })
    }

    /// A conversation `/save` wrote (or any file of that shape): an
    /// optional system message, then user and assistant messages in turn,
    /// ending with a reply. The error names the message at fault.
    pub fn from_json(text: &str) -> Result<Conversation, String> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let messages = value
            .get("messages")
            .and_then(|m| m.as_array())
            .ok_or("no \"messages\" array at the top")?;
        let mut system = None;
        let mut turns = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            let n = i + 1;
            let role = m
                .get("role")
                .and_then(|r| r.as_str())
                .ok_or(format!("message {n} has no \"role\" string"))?;
            let content = m
                .get("content")
                .and_then(|c| c.as_str())
                .ok_or(format!("message {n} has no \"content\" string"))?
                .to_string();
            let expected = if turns.len() % 2 == 0 {
                "user"
            } else {
                "assistant"
            };
            match role {
                "system" if i == 0 => system = Some(content),
                _ if role == expected => turns.push(Message::new(role, content)),
                _ => {
                    return Err(format!(
                        "message {n} has role \"{role}\" where \"{expected}\" was expected (a system message may come first, then user and assistant in turn)"
                    ))
                }
            }
        }
        if turns.len() % 2 == 1 {
            return Err(
                "the last message is from the user; a saved conversation ends with a reply".into(),
            );
        }
        Ok(Conversation { system, turns })
    }

    /// Exchanges (user messages) in the conversation.
    pub fn exchanges(&self) -> usize {
        self.turns.iter().filter(|m| m.role == "user").count()
    }

    /// The system prompt and `turns[from..]`.
    fn messages(&self, from: usize) -> Vec<Message> {
        let system = self.system.iter().map(|s| Message::system(s.clone()));
        system.chain(self.turns[from..].iter().cloned()).collect()
    }

    /// Render for a reply (with the generation prompt), dropping the oldest
    /// exchanges while `tokens + reserve > n_ctx`. When nothing is left to
    /// drop, a prompt that leaves at least one position for the reply is
    /// still taken: the reply is then cut short by the context.
    pub fn fit(
        &mut self,
        template: &ChatTemplate,
        tokenize: impl Fn(&[Message], &str) -> Result<Vec<u32>, chat::Error>,
        n_ctx: usize,
        reserve: usize,
    ) -> Result<Fit, chat::Error> {
        // Where each exchange starts; the last one is the message to answer.
        let starts: Vec<usize> = (0..self.turns.len())
            .filter(|&i| self.turns[i].role == "user")
            .collect();
        let newest = starts.len().saturating_sub(1);
        for (dropped, &from) in starts.iter().enumerate() {
            let messages = self.messages(from);
            let text = template.render(&messages, true)?;
            let tokens = tokenize(&messages, &text)?;
            let fits = tokens.len().saturating_add(reserve) <= n_ctx;
            if fits || (dropped == newest && tokens.len() < n_ctx) {
                self.turns.drain(..from);
                return Ok(Fit::Fits(Prompt {
                    text,
                    tokens,
                    dropped,
                }));
            }
            if dropped == newest {
                return Ok(Fit::TooLong {
                    tokens: tokens.len(),
                });
            }
        }
        // No user message: render what there is (nothing callers ask for).
        let messages = self.messages(0);
        let text = template.render(&messages, true)?;
        let tokens = tokenize(&messages, &text)?;
        Ok(Fit::Fits(Prompt {
            text,
            tokens,
            dropped: 0,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One "token" per character keeps the arithmetic readable.
    fn chars(_: &[Message], s: &str) -> Result<Vec<u32>, chat::Error> {
        Ok(s.chars().map(|c| c as u32).collect())
    }

    /// ChatML, whose sizes in characters are: the system message "S" 31,
    /// a user message "uN" 30, an assistant one "aN" 35, and the generation
    /// prompt "<|im_start|>assistant\n" 22.
    fn template() -> ChatTemplate {
        ChatTemplate::or_fallback(None, None, None).unwrap()
    }

    const SYSTEM: usize = 31;
    const EXCHANGE: usize = 30 + 35;
    const NEWEST: usize = 30 + 22;

    fn conversation() -> Conversation {
        let mut c = Conversation::new(Some("S".into()));
        for (u, a) in [("u1", "a1"), ("u2", "a2")] {
            c.push_user(u.into());
            c.push_assistant(a.into());
        }
        c.push_user("u3".into());
        c
    }

    fn fits(fit: Fit) -> Prompt {
        match fit {
            Fit::Fits(p) => p,
            Fit::TooLong { tokens } => panic!("too long: {tokens}"),
        }
    }

    #[test]
    fn json_round_trip_and_errors() {
        let mut c = conversation();
        c.push_assistant("a3".into());
        let back = Conversation::from_json(&c.to_json().to_string()).unwrap();
        assert_eq!(back.system.as_deref(), Some("S"));
        assert_eq!(back.turns, c.turns);
        let bad = |text: &str| Conversation::from_json(text).unwrap_err();
        assert!(bad("{").contains("not JSON"));
        assert!(bad("{}").contains("\"messages\""));
        let e =
            bad(r#"{"messages":[{"role":"user","content":"u"},{"role":"tool","content":"t"}]}"#);
        assert!(e.contains("message 2 has role \"tool\""), "{e}");
        let e = bad(r#"{"messages":[{"role":"user","content":"u"}]}"#);
        assert!(e.contains("ends with a reply"), "{e}");
        let e = bad(r#"{"messages":[{"role":"user","content":null}]}"#);
        assert!(e.contains("message 1 has no \"content\""), "{e}");
    }

    #[test]
    fn keeps_everything_that_fits() {
        let t = template();
        let mut c = conversation();
        let p = fits(c.fit(&t, chars, 1000, 10).unwrap());
        assert_eq!(p.dropped, 0);
        assert!(p
            .text
            .starts_with("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu1"));
        assert!(p.text.ends_with("u3<|im_end|>\n<|im_start|>assistant\n"));
        assert_eq!(p.tokens.len(), SYSTEM + 2 * EXCHANGE + NEWEST);
        assert_eq!(c.exchanges(), 3);
    }

    #[test]
    fn drops_oldest_exchanges_keeps_system() {
        let t = template();
        let mut c = conversation();
        let full = SYSTEM + 2 * EXCHANGE + NEWEST;
        let p = fits(c.fit(&t, chars, full + 10 - 1, 10).unwrap());
        assert_eq!(p.dropped, 1);
        assert_eq!(p.tokens.len(), full - EXCHANGE);
        assert!(p
            .text
            .starts_with("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu2"));
        assert_eq!(c.exchanges(), 2);

        // Only the newest left; then past the reserve but still in the
        // context; then not at all, and nothing dropped for it.
        let alone = SYSTEM + NEWEST;
        let mut c = conversation();
        assert_eq!(fits(c.fit(&t, chars, alone + 10, 10).unwrap()).dropped, 2);
        assert_eq!(c.exchanges(), 1);
        let mut c = conversation();
        assert_eq!(fits(c.fit(&t, chars, alone + 1, 10).unwrap()).dropped, 2);
        let mut c = conversation();
        match c.fit(&t, chars, alone, 10).unwrap() {
            Fit::TooLong { tokens } => assert_eq!(tokens, alone),
            Fit::Fits(p) => panic!("fits: {p:?}"),
        }
        assert_eq!(c.exchanges(), 3);
    }
}
