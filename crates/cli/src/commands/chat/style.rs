//! Colour for the chat on a terminal: the prompt in bold green, notices
//! dim, warnings yellow; replies keep the terminal's own colour. Off when
//! stdout or stderr is not a terminal or NO_COLOR is set (no-color.org),
//! unless `--color always`.

use std::io::IsTerminal;

/// `--color`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ColorChoice {
    #[default]
    Auto,
    Always,
    Never,
}

#[derive(Clone, Copy, Debug)]
pub struct Style {
    on: bool,
}

impl Style {
    pub fn new(choice: ColorChoice) -> Style {
        let on = match choice {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                // no-color.org: set and not empty, whatever the value.
                let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
                !no_color && std::io::stdout().is_terminal() && std::io::stderr().is_terminal()
            }
        };
        Style { on }
    }

    pub fn on(self) -> bool {
        self.on
    }

    fn paint(self, sgr: &str, text: &str) -> String {
        if self.on {
            format!("\x1b[{sgr}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }

    /// `> ` or `... `, as the prompt shows it.
    pub fn prompt(self, text: &str) -> String {
        self.paint("1;32", text)
    }

    /// A line of information on stderr.
    pub fn note(self, text: &str) {
        eprintln!("{}", self.paint("2", text));
    }

    /// A line about something that went wrong or was cut, on stderr.
    pub fn warn(self, text: &str) {
        eprintln!("{}", self.paint("33", text));
    }
}
