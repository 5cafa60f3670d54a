//! The layer check of the filesystem crate (`make lint`): every module of `fs/src` sits
//! in one layer of the table in `docs/filesystem.md` ("Layers"), and imports only from
//! its own layer unit or from lower layers.
//!
//! It reads every `crate::`, `super::` and `self::` path of every file (use trees,
//! expressions, types, the paths in attribute strings), resolves it to the module it
//! names, and fails when that module's layer is higher than the importing module's, or
//! the same layer's other unit (siblings such as `btree` and `space` stay independent).
//! Code under `#[cfg(test)]` is not checked: a test may mount a whole filesystem.
//! Within one unit (a folder) anything goes. The known exceptions — upward imports the
//! next step removes — are listed beside the table; one that no longer occurs is an
//! error too, so the list only shrinks. It also fails when a folder of `fs/src` holds
//! more than 13 entries (a file with more than 12 siblings).
//!
//! Usage: `ninefold-layers [FS_SRC_DIR DOC]` (default: this crate's `../src` and
//! `../../docs/filesystem.md`).

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Most entries of one folder of `fs/src`: a file there has at most 12 siblings.
const MAX_FOLDER_ENTRIES: usize = 13;

/// A module path below the crate root (`["core", "txn"]` is `crate::core::txn`).
type Module = Vec<String>;

/// A source file: its path below the source root, its module, its text.
type SourceFile = (String, Module, String);

fn show(m: &[String]) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// The layer table: units (module path prefixes) by layer, lowest first.
#[derive(Debug, Default)]
struct Table {
    units: Vec<(Module, usize)>,
    /// `(from, to)`: an import from a module under `from` of a module under `to` is
    /// allowed although it goes up (or sideways).
    exceptions: Vec<(Module, Module)>,
}

fn parse_module(s: &str) -> Module {
    s.split("::")
        .filter(|x| !x.is_empty() && *x != "crate")
        .map(String::from)
        .collect()
}

fn starts_with(m: &[String], prefix: &[String]) -> bool {
    m.len() >= prefix.len() && m[..prefix.len()] == *prefix
}

impl Table {
    /// Reads the two fenced blocks after the markers `<!-- layers: table -->` (lines
    /// `LAYER unit unit ...`) and `<!-- layers: exceptions -->` (lines `from -> to`,
    /// text after `#` ignored) of `doc`.
    fn from_doc(doc: &str) -> Result<Table, String> {
        let block = |marker: &str| -> Result<Vec<String>, String> {
            let at = doc
                .find(marker)
                .ok_or_else(|| format!("no `{marker}` in the document"))?;
            let mut lines = doc[at..].lines().skip(1);
            if !lines.next().is_some_and(|l| l.starts_with("```")) {
                return Err(format!("`{marker}` is not followed by a fenced block"));
            }
            Ok(lines
                .take_while(|l| !l.starts_with("```"))
                .map(|l| l.split('#').next().unwrap_or("").trim().to_string())
                .filter(|l| !l.is_empty())
                .collect())
        };
        let mut t = Table::default();
        for line in block("<!-- layers: table -->")? {
            let mut words = line.split_whitespace();
            let layer: usize = words
                .next()
                .and_then(|w| w.parse().ok())
                .ok_or_else(|| format!("table line `{line}`: no layer number first"))?;
            for w in words {
                t.units.push((parse_module(w), layer));
            }
        }
        for line in block("<!-- layers: exceptions -->")? {
            let (from, to) = line
                .split_once("->")
                .ok_or_else(|| format!("exception line `{line}`: not `from -> to`"))?;
            t.exceptions
                .push((parse_module(from.trim()), parse_module(to.trim())));
        }
        if t.units.is_empty() {
            return Err("the layer table is empty".into());
        }
        Ok(t)
    }

    /// The unit `m` belongs to (the longest matching prefix) and its layer.
    fn unit(&self, m: &[String]) -> Option<(&Module, usize)> {
        self.units
            .iter()
            .filter(|(u, _)| starts_with(m, u))
            .max_by_key(|(u, _)| u.len())
            .map(|(u, l)| (u, *l))
    }

    /// The crate root and the folders that only hold units (`features`) are in no layer.
    fn is_folder(&self, m: &[String]) -> bool {
        self.units
            .iter()
            .any(|(u, _)| u.len() > m.len() && starts_with(u, m))
    }
}

/// One import of a module by another.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Import {
    file: String,
    from: Module,
    /// The path as resolved (`crate::a::b::Item`).
    path: Module,
    /// The module it names.
    to: Module,
}

#[derive(Debug, PartialEq, Eq)]
enum Problem {
    Up {
        import: Import,
        from_layer: usize,
        to_layer: usize,
    },
    Sideways {
        import: Import,
        layer: usize,
    },
    NoLayer {
        file: String,
        module: Module,
    },
    UnusedException {
        from: Module,
        to: Module,
    },
    BigFolder {
        dir: String,
        entries: usize,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Up {
                import: i,
                from_layer,
                to_layer,
            } => write!(
                f,
                "{}: `{}` (layer {from_layer}) imports `crate::{}` of `{}` (layer {to_layer}): \
                 a lower layer may not import a higher one",
                i.file,
                show(&i.from),
                show(&i.path),
                show(&i.to)
            ),
            Problem::Sideways { import: i, layer } => write!(
                f,
                "{}: `{}` imports `crate::{}` of `{}`, another unit of the same layer ({layer}): \
                 siblings stay independent",
                i.file,
                show(&i.from),
                show(&i.path),
                show(&i.to)
            ),
            Problem::NoLayer { file, module } => write!(
                f,
                "{file}: module `{}` is in no layer of the table (docs/filesystem.md, \"Layers\")",
                show(module)
            ),
            Problem::UnusedException { from, to } => write!(
                f,
                "the exception `{} -> {}` no longer occurs: delete it from docs/filesystem.md",
                show(from),
                show(to)
            ),
            Problem::BigFolder { dir, entries } => write!(
                f,
                "{dir}: {entries} entries, more than {MAX_FOLDER_ENTRIES} (a file there has more \
                 than {} siblings): split it",
                MAX_FOLDER_ENTRIES - 1
            ),
        }
    }
}

/// A token of Rust source, as far as paths need.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    /// `::`
    Colons,
    Punct(char),
    /// A string literal's contents (paths in attributes such as `serialize_with`).
    Str(String),
}

fn lex(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == '"' {
            i += 1;
            let start = i;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            out.push(Tok::Str(c[start..i.min(c.len())].iter().collect()));
            i += 1;
        } else if ch == '\'' {
            // A char literal ('a', '\n', '{') or a lifetime ('a).
            if c.get(i + 1) == Some(&'\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            // Raw strings: r"..", r#".."#, br"..".
            if (word == "r" || word == "br") && matches!(c.get(i), Some('"') | Some('#')) {
                let mut hashes = 0;
                while c.get(i) == Some(&'#') {
                    hashes += 1;
                    i += 1;
                }
                if c.get(i) == Some(&'"') {
                    i += 1;
                    let start = i;
                    loop {
                        if i >= c.len() {
                            break;
                        }
                        if c[i] == '"' && (0..hashes).all(|k| c.get(i + 1 + k) == Some(&'#')) {
                            break;
                        }
                        i += 1;
                    }
                    out.push(Tok::Str(c[start..i.min(c.len())].iter().collect()));
                    i += 1 + hashes;
                    continue;
                }
            }
            out.push(Tok::Ident(word));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push(Tok::Colons);
            i += 2;
        } else {
            out.push(Tok::Punct(ch));
            i += 1;
        }
    }
    out
}

fn is_root(t: &Tok) -> bool {
    matches!(t, Tok::Ident(w) if w == "crate" || w == "super" || w == "self")
}

/// The leaves of the use tree at `toks[*i]` (just after a `::{`), each as a list of
/// segments after `prefix`; leaves `*i` after the closing `}`.
fn use_group(toks: &[Tok], i: &mut usize, prefix: &[String], out: &mut Vec<Module>) {
    let mut cur: Module = prefix.to_vec();
    while *i < toks.len() {
        match &toks[*i] {
            Tok::Punct('}') => {
                *i += 1;
                if cur.len() > prefix.len() {
                    out.push(cur);
                }
                return;
            }
            Tok::Punct(',') => {
                if cur.len() > prefix.len() {
                    out.push(cur.clone());
                }
                cur = prefix.to_vec();
                *i += 1;
            }
            Tok::Punct('{') => {
                *i += 1;
                let p = cur.clone();
                use_group(toks, i, &p, out);
                cur = prefix.to_vec();
            }
            Tok::Ident(w) if w == "self" => {
                // `a::{self, ..}` names `a` itself.
                if cur.len() == prefix.len() {
                    out.push(prefix.to_vec());
                }
                *i += 1;
            }
            Tok::Ident(w) if w == "as" => {
                *i += 2;
            }
            Tok::Ident(w) => {
                cur.push(w.clone());
                *i += 1;
            }
            _ => *i += 1,
        }
    }
}

/// Every `crate::`/`super::`/`self::` path of `src` outside `#[cfg(test)]` items, with
/// the module (inline modules included) it is written in.
fn paths(src: &str, file_module: &[String]) -> Vec<(Module, Vec<String>)> {
    let toks = lex(src);
    let mut out = Vec::new();
    scan(&toks, file_module, &mut out);
    out
}

fn scan(toks: &[Tok], file_module: &[String], out: &mut Vec<(Module, Vec<String>)>) {
    // Inline modules open: (name, brace depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut test_item = false;
    let mut i = 0;
    let here = |inline: &Vec<(String, usize)>| -> Module {
        let mut m = file_module.to_vec();
        m.extend(inline.iter().map(|(n, _)| n.clone()));
        m
    };
    while i < toks.len() {
        // `#[cfg(test)]`: the next item (up to its `;` or its closing brace) is skipped.
        if toks[i] == Tok::Punct('#')
            && toks.get(i + 1) == Some(&Tok::Punct('['))
            && toks.get(i + 2) == Some(&Tok::Ident("cfg".into()))
            && toks.get(i + 3) == Some(&Tok::Punct('('))
            && toks.get(i + 4) == Some(&Tok::Ident("test".into()))
            && toks.get(i + 5) == Some(&Tok::Punct(')'))
        {
            test_item = true;
            i += 7;
            continue;
        }
        if test_item {
            match toks[i] {
                Tok::Punct(';') => {
                    test_item = false;
                    i += 1;
                }
                Tok::Punct('{') => {
                    let mut d = 0;
                    while i < toks.len() {
                        match toks[i] {
                            Tok::Punct('{') => d += 1,
                            Tok::Punct('}') => {
                                d -= 1;
                                if d == 0 {
                                    break;
                                }
                            }
                            _ => {}
                        }
                        i += 1;
                    }
                    test_item = false;
                    i += 1;
                }
                _ => i += 1,
            }
            continue;
        }
        match &toks[i] {
            Tok::Ident(w) if w == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Punct('{'))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    depth += 1;
                    inline.push((name.clone(), depth));
                    i += 3;
                    continue;
                }
                i += 1;
            }
            Tok::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Tok::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Tok::Str(s) => {
                // Paths in attribute strings (`serialize_with = "crate::a::f"`).
                if s.contains("::") && !s.contains(char::is_whitespace) {
                    let inner = lex(s);
                    if inner.first().is_some_and(is_root) {
                        let mut sub = Vec::new();
                        scan(&inner, &here(&inline), &mut sub);
                        out.extend(sub);
                    }
                }
                i += 1;
            }
            t if is_root(t)
                && toks.get(i + 1) == Some(&Tok::Colons)
                && !(i > 0 && toks[i - 1] == Tok::Punct('$')) =>
            {
                let mut segs = Vec::new();
                let mut group = false;
                while let Some(Tok::Ident(w)) = toks.get(i) {
                    segs.push(w.clone());
                    i += 1;
                    if toks.get(i) != Some(&Tok::Colons) {
                        break;
                    }
                    i += 1;
                    // `a::{..}`: a use group (a `{` without `::` is a block or a literal).
                    group = toks.get(i) == Some(&Tok::Punct('{'));
                }
                if group {
                    i += 1;
                    let mut leaves = Vec::new();
                    use_group(toks, &mut i, &segs, &mut leaves);
                    for l in leaves {
                        out.push((here(&inline), l));
                    }
                } else {
                    out.push((here(&inline), segs));
                }
            }
            _ => i += 1,
        }
    }
}

/// `path` (starting `crate`, `super` or `self`) written in module `at`, as a path from
/// the crate root.
fn absolute(at: &[String], path: &[String]) -> Module {
    let mut cur: Module = at.to_vec();
    let mut rest = path;
    if rest.first().is_some_and(|s| s == "crate") {
        cur.clear();
        rest = &rest[1..];
    } else {
        while let Some(s) = rest.first() {
            match s.as_str() {
                "super" => {
                    cur.pop();
                }
                "self" => {}
                _ => break,
            }
            rest = &rest[1..];
        }
    }
    cur.extend(rest.iter().cloned());
    cur
}

/// The module of `file` (relative to the source root): `a/b.rs` and `a/b/mod.rs` are
/// `a::b`, `lib.rs` the root.
fn module_of(rel: &Path) -> Module {
    let mut m: Module = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if m.last().is_some_and(|l| l == "mod" || l == "lib") {
        m.pop();
    }
    m
}

/// Checks `files` (path relative to the source root, module, source) against `table`.
/// Returns the problems, the imports between modules and how many of them the
/// exceptions allowed.
fn check(files: &[SourceFile], table: &Table) -> (Vec<Problem>, usize, usize) {
    let modules: BTreeSet<&Module> = files.iter().map(|(_, m, _)| m).collect();
    let mut imports = BTreeSet::new();
    for (file, module, src) in files {
        for (at, path) in paths(src, module) {
            let abs = absolute(&at, &path);
            let to = (0..=abs.len())
                .rev()
                .map(|n| abs[..n].to_vec())
                .find(|p| modules.contains(p))
                .unwrap_or_default();
            if to != *module {
                imports.insert(Import {
                    file: file.clone(),
                    from: module.clone(),
                    path: abs,
                    to,
                });
            }
        }
    }
    let mut problems = Vec::new();
    for (file, module, _) in files {
        if table.unit(module).is_none() && !table.is_folder(module) {
            problems.push(Problem::NoLayer {
                file: file.clone(),
                module: module.clone(),
            });
        }
    }
    let mut used = vec![false; table.exceptions.len()];
    let mut excused = 0;
    for imp in &imports {
        let (Some((fu, fl)), Some((tu, tl))) = (table.unit(&imp.from), table.unit(&imp.to)) else {
            continue;
        };
        let problem = if tl > fl {
            Problem::Up {
                import: imp.clone(),
                from_layer: fl,
                to_layer: tl,
            }
        } else if tl == fl && fu != tu {
            Problem::Sideways {
                import: imp.clone(),
                layer: fl,
            }
        } else {
            continue;
        };
        let exception = table
            .exceptions
            .iter()
            .position(|(f, t)| starts_with(&imp.from, f) && starts_with(&imp.to, t));
        match exception {
            Some(k) => {
                used[k] = true;
                excused += 1;
            }
            None => problems.push(problem),
        }
    }
    for (k, (from, to)) in table.exceptions.iter().enumerate() {
        if !used[k] {
            problems.push(Problem::UnusedException {
                from: from.clone(),
                to: to.clone(),
            });
        }
    }
    (problems, imports.len(), excused)
}

fn read_tree(root: &Path) -> Result<(Vec<SourceFile>, Vec<Problem>), String> {
    let mut files = Vec::new();
    let mut problems = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let mut entries = 0;
        for e in fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
            let path = e.map_err(|e| format!("{}: {e}", dir.display()))?.path();
            entries += 1;
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                let rel = path.strip_prefix(root).unwrap_or(&path);
                let src =
                    fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                files.push((rel.display().to_string(), module_of(rel), src));
            }
        }
        if entries > MAX_FOLDER_ENTRIES {
            problems.push(Problem::BigFolder {
                dir: dir.display().to_string(),
                entries,
            });
        }
    }
    files.sort();
    Ok((files, problems))
}

fn main() -> ExitCode {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (root, doc) = match &args[..] {
        [] => {
            let root = here.parent().unwrap_or(here);
            let top = root.parent().unwrap_or(root);
            (root.join("src"), top.join("docs/filesystem.md"))
        }
        [root, doc] => (root.clone(), doc.clone()),
        _ => {
            eprintln!("usage: ninefold-layers [FS_SRC_DIR LAYERS_DOC]");
            return ExitCode::from(2);
        }
    };
    let run = || -> Result<(Vec<Problem>, usize, usize, usize), String> {
        let text = fs::read_to_string(&doc).map_err(|e| format!("{}: {e}", doc.display()))?;
        let table = Table::from_doc(&text)?;
        let (files, mut problems) = read_tree(&root)?;
        let (more, imports, excused) = check(&files, &table);
        problems.extend(more);
        Ok((problems, files.len(), imports, excused))
    };
    match run() {
        Ok((problems, files, imports, excused)) if problems.is_empty() => {
            println!(
                "layers: {files} files, {imports} imports between modules, all downward but \
                 {excused} through the listed exceptions"
            );
            ExitCode::SUCCESS
        }
        Ok((problems, ..)) => {
            for p in &problems {
                eprintln!("layers: {p}");
            }
            eprintln!(
                "layers: {} problems (the table: {}, \"Layers\")",
                problems.len(),
                doc.display()
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("layers: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str =
        "# x\n<!-- layers: table -->\n```text\n2 top\n1 mid other # siblings\n0 low\n```\n\
        <!-- layers: exceptions -->\n```text\nlow::old -> top   # going away\n```\n";

    fn file(path: &str, src: &str) -> SourceFile {
        (path.into(), module_of(Path::new(path)), src.into())
    }

    fn problems(files: &[SourceFile]) -> Vec<String> {
        let table = Table::from_doc(DOC).unwrap();
        check(files, &table)
            .0
            .iter()
            .map(|p| p.to_string())
            .collect()
    }

    /// The files every case starts from: downward imports only, one exception used.
    fn base() -> Vec<SourceFile> {
        vec![
            file(
                "lib.rs",
                "pub mod low; pub mod mid; pub mod other; pub mod top;",
            ),
            file("low/mod.rs", "pub mod old; pub struct L;"),
            file("low/old.rs", "use crate::top::T;"),
            file(
                "mid.rs",
                "use crate::low::{self, L};\nfn f() { super::low::L; }",
            ),
            file("other.rs", "use crate::low::L;"),
            file(
                "top/mod.rs",
                "use crate::mid; use super::other; pub struct T; mod a;",
            ),
            file("top/a.rs", "use super::T; use super::super::low::L;"),
        ]
    }

    #[test]
    fn downward_imports_pass() {
        assert_eq!(problems(&base()), Vec::<String>::new());
    }

    #[test]
    fn an_upward_import_fails() {
        let mut files = base();
        files[3].2.push_str("\nuse crate::top::T;");
        let p = problems(&files);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].contains("`mid` (layer 1) imports `crate::top::T`"),
            "{p:?}"
        );
    }

    #[test]
    fn upward_through_super_a_group_a_string_or_an_expression_fails() {
        for src in [
            "use super::top::T;",
            "use crate::{low::L, top::{T}};",
            "#[serde(serialize_with = \"crate::top::f\")] struct S;",
            "fn f() -> u8 { crate::top::f() }",
            "fn f() -> T { crate::top::T { a: crate::low::L } }",
            "fn f(x: u64) { if x > crate::top::MAX { g() } }",
            "mod inner { fn f() { super::super::top::f(); } }",
        ] {
            let mut files = base();
            files[3].2 = src.into();
            let p = problems(&files);
            assert_eq!(p.len(), 1, "{src}: {p:?}");
        }
    }

    #[test]
    fn siblings_stay_independent() {
        let mut files = base();
        files[4].2.push_str("\nuse crate::mid::M;");
        let p = problems(&files);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("another unit of the same layer"), "{p:?}");
    }

    #[test]
    fn test_code_comments_and_strings_are_not_imports() {
        let mut files = base();
        files[1].2.push_str(
            "\n#[cfg(test)]\nmod tests { use crate::top::T; }\n// crate::top::T\n\
             /// [`crate::top`]\nconst S: &str = \"see crate::top::T here\";\n\
             #[cfg(test)]\nuse crate::top::T;\nfn f<'a>(c: char) -> bool { c == '{' }",
        );
        assert_eq!(problems(&files), Vec::<String>::new());
    }

    #[test]
    fn exceptions_must_still_occur_and_modules_must_have_a_layer() {
        let mut files = base();
        files[2].2 = String::new();
        files.push(file("stray.rs", ""));
        let p = problems(&files);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p.iter().any(|p| p.contains("no longer occurs")), "{p:?}");
        assert!(
            p.iter().any(|p| p.contains("`stray` is in no layer")),
            "{p:?}"
        );
    }
}
