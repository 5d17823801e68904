//! Task passages: a few facts about invented entities, then questions
//! whose answers are in those facts, so a small model learns to read its
//! context and answer from it.
//!
//! ```text
//! Zorvath is a city in the land of Quellen. It is known for copper bells. Quellen is ruled by Queen Ismara.
//! Q: Who rules the land where Zorvath is?
//! A: Queen Ismara.
//! Q: Where is Zorvath?
//! A: In the land of Quellen.
//! ```
//!
//! Three kinds of entity (a place, a creature, a person), one or two per
//! passage, each with its facts and questions; some questions take two
//! hops (the ruler of the land a city is in). About one passage in four
//! also asks about a name it never mentioned, answered `I don't know.`
//! (about 9% of all answers). A passage is its fact line, then `Q:`/`A:`
//! lines; it ends with `\n` and holds no blank line, so a file of passages
//! separated by blank lines splits back into them.

use crate::names::{capitalize, NameGen, Side};
use crate::rng::Rng;
use std::collections::HashSet;

const PLACE_KINDS: &[&str] = &["city", "town", "village", "port"];
const KNOWN_FOR: &[&str] = &[
    "copper bells",
    "salt fish",
    "blue glass",
    "wool cloth",
    "silver mines",
    "apple wine",
    "stone bridges",
    "horse fairs",
    "red clay pots",
    "river pearls",
    "tall towers",
    "bitter tea",
    "fine rope",
    "iron nails",
    "honey cakes",
    "painted boats",
    "old songs",
    "white marble",
    "cedar ships",
    "goat cheese",
    "glass beads",
    "warm springs",
];
const TITLES: &[&str] = &["King", "Queen"];
const ANIMAL_KINDS: &[&str] = &[
    "bird", "fish", "beetle", "lizard", "goat", "moth", "snake", "frog", "deer", "rabbit",
];
const FOODS: &[&str] = &[
    "river snails",
    "pine seeds",
    "small fish",
    "wild berries",
    "moss",
    "beetles",
    "grass roots",
    "fallen fruit",
    "reed shoots",
    "mushrooms",
    "worms",
    "clover",
];
const HABITATS: &[&str] = &[
    "hills",
    "marshes",
    "forests",
    "caves",
    "rivers",
    "deserts",
    "meadows",
    "cliffs",
    "lakes",
    "mountains",
];
const TRADES: &[&str] = &[
    "weaver",
    "smith",
    "baker",
    "potter",
    "fisher",
    "miller",
    "carpenter",
    "shepherd",
    "scribe",
    "healer",
    "mason",
    "tanner",
];
const COLORS: &[&str] = &[
    "red", "grey", "black", "white", "brown", "golden", "spotted", "blue",
];
const PETS: &[&str] = &["horse", "goat", "dog", "cat", "hawk", "mule", "crow", "ox"];

/// The fixed words of the templates, which no invented name may be.
const TEMPLATE_TEXT: &str = "is a in the land of it known for ruled by kind eat live lives \
    who has have where what do does which rules q a i don't know an";

/// Chance that a passage also asks about a name it never mentioned.
const UNKNOWN_CHANCE: f64 = 0.25;
pub const DONT_KNOW: &str = "I don't know.";

/// Every word of the templates and their word lists, lower case.
pub fn template_words() -> HashSet<String> {
    let lists = [
        PLACE_KINDS,
        KNOWN_FOR,
        TITLES,
        ANIMAL_KINDS,
        FOODS,
        HABITATS,
        TRADES,
        COLORS,
        PETS,
    ];
    let mut words: HashSet<String> = crate::names::words(TEMPLATE_TEXT).collect();
    for list in lists {
        for item in list {
            words.extend(crate::names::words(item));
        }
    }
    words
}

struct Qa {
    q: String,
    a: String,
}

/// Generates passages with names from one side of the split.
pub struct TaskGen<'a> {
    rng: Rng,
    names: NameGen<'a>,
}

/// `a`/`an` before a word.
fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u', 'A', 'E', 'I', 'O', 'U']) {
        "an"
    } else {
        "a"
    }
}

/// First letter upper case, for an answer that starts with a list item.
fn sentence(s: &str) -> String {
    capitalize(s)
}

impl<'a> TaskGen<'a> {
    /// `forbidden`: lower-case words no name may be (the corpus's words and
    /// [`template_words`]).
    pub fn new(seed: u64, side: Side, forbidden: &'a HashSet<String>) -> TaskGen<'a> {
        // One stream per side: the eval passages stay the same whatever
        // amount of training text is asked for.
        let stream = match side {
            Side::Train => 1,
            Side::HeldOut => 2,
        };
        TaskGen {
            rng: Rng::stream(seed, stream),
            names: NameGen::new(side, forbidden),
        }
    }

    fn name(&mut self, taken: &mut Vec<String>) -> String {
        let n = self.names.draw(&mut self.rng, taken);
        taken.push(n.clone());
        n
    }

    /// One passage, ending in `\n`.
    pub fn passage(&mut self) -> String {
        let mut taken = Vec::new();
        let mut facts = Vec::new();
        let mut qas = Vec::new();
        for _ in 0..1 + self.rng.below(2) {
            match self.rng.below(3) {
                0 => self.place(&mut taken, &mut facts, &mut qas),
                1 => self.creature(&mut taken, &mut facts, &mut qas),
                _ => self.person(&mut taken, &mut facts, &mut qas),
            }
        }
        self.rng.shuffle(&mut qas);
        qas.truncate(2 + self.rng.below(2));
        if self.rng.chance(UNKNOWN_CHANCE) {
            let qa = self.unknown(&mut taken);
            let at = self.rng.below(qas.len() + 1);
            qas.insert(at, qa);
        }
        let mut text = facts.join(" ");
        text.push('\n');
        for qa in &qas {
            text.push_str(&format!("Q: {}\nA: {}\n", qa.q, qa.a));
        }
        text
    }

    /// `N passages`.
    pub fn passages(&mut self, n: usize) -> Vec<String> {
        (0..n).map(|_| self.passage()).collect()
    }

    /// Passages until their text (with the blank lines between them) is at
    /// least `bytes` long.
    pub fn passages_until(&mut self, bytes: usize) -> Vec<String> {
        let mut out = Vec::new();
        let mut total = 0;
        while total < bytes {
            let p = self.passage();
            total += p.len() + 1;
            out.push(p);
        }
        out
    }

    fn place(&mut self, taken: &mut Vec<String>, facts: &mut Vec<String>, qas: &mut Vec<Qa>) {
        let city = capitalize(&self.name(taken));
        let land = capitalize(&self.name(taken));
        let kind = *self.rng.pick(PLACE_KINDS);
        let known = *self.rng.pick(KNOWN_FOR);
        facts.push(format!(
            "{city} is {} {kind} in the land of {land}. It is known for {known}.",
            article(kind)
        ));
        qas.push(Qa {
            q: format!("Where is {city}?"),
            a: format!("In the land of {land}."),
        });
        qas.push(Qa {
            q: format!("What is {city} known for?"),
            a: format!("{}.", sentence(known)),
        });
        if self.rng.chance(0.5) {
            let title = *self.rng.pick(TITLES);
            let ruler = capitalize(&self.name(taken));
            facts.push(format!("{land} is ruled by {title} {ruler}."));
            qas.push(Qa {
                q: format!("Who rules {land}?"),
                a: format!("{title} {ruler}."),
            });
            qas.push(Qa {
                q: format!("Who rules the land where {city} is?"),
                a: format!("{title} {ruler}."),
            });
        }
    }

    fn creature(&mut self, taken: &mut Vec<String>, facts: &mut Vec<String>, qas: &mut Vec<Qa>) {
        let one = self.name(taken);
        let many = format!("{one}s");
        let land = capitalize(&self.name(taken));
        let kind = *self.rng.pick(ANIMAL_KINDS);
        let food = *self.rng.pick(FOODS);
        let habitat = *self.rng.pick(HABITATS);
        let (a, many_cap) = (article(&one), capitalize(&many));
        facts.push(format!(
            "{} {one} is a kind of {kind}. {many_cap} eat {food}. {many_cap} live in the \
             {habitat} of {land}.",
            capitalize(a)
        ));
        qas.push(Qa {
            q: format!("What is {a} {one}?"),
            a: format!("A kind of {kind}."),
        });
        qas.push(Qa {
            q: format!("What do {many} eat?"),
            a: format!("{}.", sentence(food)),
        });
        qas.push(Qa {
            q: format!("Where do {many} live?"),
            a: format!("In the {habitat} of {land}."),
        });
    }

    fn person(&mut self, taken: &mut Vec<String>, facts: &mut Vec<String>, qas: &mut Vec<Qa>) {
        let person = capitalize(&self.name(taken));
        let town = capitalize(&self.name(taken));
        let trade = *self.rng.pick(TRADES);
        let (color, pet) = (*self.rng.pick(COLORS), *self.rng.pick(PETS));
        facts.push(format!(
            "{person} is {} {trade} who lives in {town}. {person} has {} {color} {pet}.",
            article(trade),
            article(color)
        ));
        qas.push(Qa {
            q: format!("Who is {person}?"),
            a: format!(
                "{} {trade} who lives in {town}.",
                capitalize(article(trade))
            ),
        });
        qas.push(Qa {
            q: format!("Where does {person} live?"),
            a: format!("In {town}."),
        });
        qas.push(Qa {
            q: format!("What does {person} have?"),
            a: format!("{} {color} {pet}.", capitalize(article(color))),
        });
        if self.rng.chance(0.5) {
            let land = capitalize(&self.name(taken));
            facts.push(format!("{town} is a town in the land of {land}."));
            qas.push(Qa {
                q: format!("In which land does {person} live?"),
                a: format!("In the land of {land}."),
            });
        }
    }

    /// A question about a name the passage never mentions.
    fn unknown(&mut self, taken: &mut Vec<String>) -> Qa {
        let name = self.name(taken);
        let cap = capitalize(&name);
        let q = match self.rng.below(5) {
            0 => format!("Where is {cap}?"),
            1 => format!("Who rules {cap}?"),
            2 => format!("Who is {cap}?"),
            3 => format!("What is {cap} known for?"),
            _ => format!("What do {name}s eat?"),
        };
        Qa {
            q,
            a: DONT_KNOW.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden() -> HashSet<String> {
        template_words()
    }

    #[test]
    fn passages_are_well_formed() {
        let forbidden = forbidden();
        let mut tasks = TaskGen::new(5, Side::Train, &forbidden);
        for p in tasks.passages(200) {
            assert!(p.ends_with('\n') && !p.contains("\n\n"), "{p:?}");
            let lines: Vec<&str> = p.lines().collect();
            assert!(lines.len() >= 5 && lines.len() % 2 == 1, "{p}");
            for pair in lines[1..].chunks(2) {
                assert!(pair[0].starts_with("Q: ") && pair[0].ends_with('?'), "{p}");
                assert!(pair[1].starts_with("A: ") && pair[1].ends_with('.'), "{p}");
            }
        }
    }

    #[test]
    fn answers_come_from_the_facts() {
        // Every answer other than "I don't know." names something the fact
        // line says; every "I don't know." asks about a name it does not.
        let forbidden = forbidden();
        let mut tasks = TaskGen::new(9, Side::Train, &forbidden);
        let (mut answers, mut unknown) = (0, 0);
        for p in tasks.passages(500) {
            let lines: Vec<&str> = p.lines().collect();
            let facts: HashSet<String> = crate::names::words(lines[0]).collect();
            for pair in lines[1..].chunks(2) {
                let (q, a) = (&pair[0][3..], &pair[1][3..]);
                answers += 1;
                if a == DONT_KNOW {
                    unknown += 1;
                    let asked: Vec<String> = crate::names::words(q)
                        .filter(|w| !forbidden.contains(w))
                        .collect();
                    assert_eq!(asked.len(), 1, "{p}");
                    let name = asked[0].strip_suffix('s').unwrap_or(&asked[0]);
                    assert!(!facts.contains(name), "{p}");
                    assert!(!facts.contains(&format!("{name}s")), "{p}");
                } else {
                    for w in crate::names::words(a).filter(|w| !forbidden.contains(w)) {
                        assert!(facts.contains(&w), "{w} in {p}");
                    }
                }
            }
        }
        let share = unknown as f64 / answers as f64;
        assert!((0.05..0.14).contains(&share), "{share}");
    }

    #[test]
    fn same_seed_same_passages_and_sides_use_their_own_names() {
        let forbidden = forbidden();
        let a = TaskGen::new(1, Side::Train, &forbidden).passages(50);
        let b = TaskGen::new(1, Side::Train, &forbidden).passages(50);
        assert_eq!(a, b);
        let c = TaskGen::new(2, Side::Train, &forbidden).passages(50);
        assert_ne!(a, c);
        for p in TaskGen::new(1, Side::HeldOut, &forbidden).passages(50) {
            for w in crate::names::words(&p).filter(|w| !forbidden.contains(w)) {
                let stem = w.strip_suffix('s').unwrap_or(&w);
                assert!(crate::names::is_held_out(stem), "{w} in {p}");
            }
        }
    }
}
