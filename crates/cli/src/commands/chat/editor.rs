//! The line editor on a terminal: rustyline, with the history kept in
//! `${XDG_CACHE_HOME:-~/.cache}/cachefit/chat_history` and Ctrl-C that
//! clears a line (on an empty one it reports [`Line::Interrupted`]).
//!
//! It reads and draws on the terminal itself (`/dev/tty`), so stdout keeps
//! only the replies even when it is redirected. History that cannot be read
//! or written is a warning once, never an error.

use super::input::{Line, LineSource, Prompt};
use super::style::Style;
use rustyline::config::{Behavior, ColorMode, Config};
use rustyline::error::ReadlineError;
use rustyline::history::FileHistory;
use rustyline::{Cmd, ConditionalEventHandler, Event, EventContext, EventHandler, KeyEvent};
use rustyline::{Movement, RepeatCount};
use std::io;
use std::path::PathBuf;

pub struct Editor {
    editor: rustyline::Editor<(), FileHistory>,
    /// Where the history is kept (None: not kept).
    history: Option<PathBuf>,
    style: Style,
}

/// Ctrl-C on a line with text clears it; on an empty line it interrupts.
struct ClearOrInterrupt;

impl ConditionalEventHandler for ClearOrInterrupt {
    fn handle(&self, _: &Event, _: RepeatCount, _: bool, ctx: &EventContext) -> Option<Cmd> {
        (!ctx.line().is_empty()).then_some(Cmd::Kill(Movement::WholeBuffer))
    }
}

/// The history file: `$XDG_CACHE_HOME/cachefit/chat_history`, else under
/// `~/.cache` (XDG says a relative XDG_CACHE_HOME is to be ignored).
pub fn history_path() -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("cachefit").join("chat_history"))
}

impl Editor {
    /// An editor on the terminal, with the history at `history` (loaded now).
    pub fn new(history: Option<PathBuf>, style: Style) -> io::Result<Editor> {
        let config = Config::builder()
            .max_history_size(1000)
            .map_err(to_io)?
            .behavior(Behavior::PreferTerm)
            .color_mode(if style.on() {
                ColorMode::Forced
            } else {
                ColorMode::Disabled
            })
            .build();
        let mut editor = rustyline::Editor::with_config(config).map_err(to_io)?;
        // The () helper passes the styled prompt through when colours are on.
        editor.set_helper(Some(()));
        editor.bind_sequence(
            KeyEvent::ctrl('C'),
            EventHandler::Conditional(Box::new(ClearOrInterrupt)),
        );
        let mut this = Editor {
            editor,
            history,
            style,
        };
        if let Some(path) = this.history.clone() {
            let loaded = match this.editor.load_history(&path) {
                Err(ReadlineError::Io(e)) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                other => other,
            };
            let made = path
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .map_err(ReadlineError::Io);
            if let Err(e) = loaded.and(made) {
                this.history_failed(e);
            }
        }
        Ok(this)
    }

    /// Keep a line in the history, and append it to the file at once (an
    /// exit with Ctrl-C does not run destructors).
    fn remember(&mut self, line: &str) {
        if line.trim().is_empty() {
            return;
        }
        let added = self.editor.add_history_entry(line);
        let written = match &self.history {
            Some(path) => added.and_then(|_| self.editor.append_history(path)),
            None => added.map(|_| ()),
        };
        if let Err(e) = written {
            self.history_failed(e);
        }
    }

    fn history_failed(&mut self, e: ReadlineError) {
        if let Some(path) = self.history.take() {
            self.style.warn(&format!(
                "cachefit: warning: the chat history {} cannot be used ({e}); this chat's lines are not kept",
                path.display()
            ));
        }
    }
}

fn to_io(e: ReadlineError) -> io::Error {
    match e {
        ReadlineError::Io(e) => e,
        e => io::Error::other(e),
    }
}

impl LineSource for Editor {
    fn read_line(&mut self, prompt: Prompt, _limit: u64) -> io::Result<Line> {
        let raw = prompt.text();
        let styled = self.style.prompt(raw);
        match self.editor.readline(&(raw, styled.as_str())) {
            Ok(text) => {
                self.remember(&text);
                let bytes = text.len() as u64 + 1;
                Ok(Line::Text { text, bytes })
            }
            Err(ReadlineError::Eof) => Ok(Line::Eof),
            Err(ReadlineError::Interrupted) => Ok(Line::Interrupted),
            Err(e) => Err(to_io(e)),
        }
    }
}
