//! How one node of a counters document becomes metrics ([`Rule`]): plain data, so that
//! each part of a document (the filesystem's counters, the 9P service's) defines its
//! rules beside its counters without the walk's JSON dependency ([`crate::document`],
//! feature `json`, applies them).

/// What a [`Rule`] says of the node at its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// A number that only goes up (the default for numbers).
    Counter,
    /// A number that goes up and down.
    Gauge,
    /// A serialised [`LatencyHistogram`](crate::histogram::LatencyHistogram) (recognised by its shape; the rule gives it a
    /// name or help text).
    Histogram,
    /// Not a metric.
    Skip,
    /// An object whose keys are values of the label.
    Keys {
        /// The label's name.
        label: &'static str,
    },
    /// An array of objects, each labelled by one of its string fields.
    Elements {
        /// The label's name.
        label: &'static str,
        /// The field whose value labels the element.
        field: &'static str,
    },
    /// Nothing but a name (see [`Rule::name`]).
    Rename,
}

/// How one node of the document becomes metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The node's path (see the module documentation).
    pub path: &'static str,
    /// What the node is.
    pub action: Action,
    /// For a number or histogram, the metric's name after the prefix, without
    /// `_total`; for a map of [`Action::Keys`], that of the numbers or histograms it
    /// maps to; for another object or array, the word its key adds to the names below
    /// it (empty: none).
    pub name: Option<&'static str>,
    /// The `# HELP` text (else the node's path).
    pub help: Option<&'static str>,
}

impl Rule {
    const fn new(path: &'static str, action: Action) -> Rule {
        Rule {
            path,
            action,
            name: None,
            help: None,
        }
    }

    /// The number at `path` is a counter (what numbers are by default: for a name or
    /// help text).
    pub const fn counter(path: &'static str) -> Rule {
        Rule::new(path, Action::Counter)
    }

    /// The number at `path` is a gauge.
    pub const fn gauge(path: &'static str) -> Rule {
        Rule::new(path, Action::Gauge)
    }

    /// The histogram at `path` (for a name or help text).
    pub const fn histogram(path: &'static str) -> Rule {
        Rule::new(path, Action::Histogram)
    }

    /// The node at `path` is not exposed.
    pub const fn skip(path: &'static str) -> Rule {
        Rule::new(path, Action::Skip)
    }

    /// The object at `path` maps values of `label` to what is counted for each.
    pub const fn keys(path: &'static str, label: &'static str) -> Rule {
        Rule::new(path, Action::Keys { label })
    }

    /// The array at `path` holds objects labelled `label` by their string `field`.
    pub const fn elements(path: &'static str, label: &'static str, field: &'static str) -> Rule {
        Rule::new(path, Action::Elements { label, field })
    }

    /// The object at `path` adds `word` to the names below it instead of its key.
    pub const fn rename(path: &'static str, word: &'static str) -> Rule {
        Rule::new(path, Action::Rename).named(word)
    }

    /// With this name (see [`Rule::name`]).
    pub const fn named(mut self, name: &'static str) -> Rule {
        self.name = Some(name);
        self
    }

    /// With this help text.
    pub const fn help(mut self, help: &'static str) -> Rule {
        self.help = Some(help);
        self
    }
}
