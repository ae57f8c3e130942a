//! The doc-link check: every relative link and `#anchor` in every tracked
//! Markdown file resolves — the file (or folder) exists inside the
//! repository, and an anchor names a heading of its Markdown file by the
//! slug GitHub gives it. Runs with the root crate's tests (`scripts/test`'s
//! unit tests), so it needs no dev cluster and no Slurm headers.
//!
//! Links in fenced code blocks and inline code are not links; `http(s):`,
//! `mailto:` and other scheme links are not checked (no network here).

use std::collections::{BTreeMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// One link that does not resolve: where it is and why.
#[derive(Debug, PartialEq, Eq)]
struct Broken {
    file: String,
    line: usize,
    target: String,
    why: String,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: link '{}': {}",
            self.file, self.line, self.target, self.why
        )
    }
}

/// GitHub's heading slug (github-slugger): lower case, every character but
/// letters, digits, `_`, `-` and spaces dropped, spaces turned to `-`.
/// Inline code marks and emphasis stars are markup, not text; a link in a
/// heading counts by its text.
fn slug(heading: &str) -> String {
    let text = link_texts(heading);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// `[text](target)` → `text`, and backticks and stars removed: a heading's
/// rendered text.
fn link_texts(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find("](").and_then(|close| {
            after[close + 2..]
                .find(')')
                .map(|end| (close, close + 2 + end))
        }) {
            Some((close, end)) => {
                out.push_str(&after[..close]);
                rest = &after[end + 1..];
            }
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.chars().filter(|c| !matches!(c, '`' | '*')).collect()
}

/// The lines of a Markdown text outside fenced code blocks, with inline code
/// spans blanked, numbered from 1.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fence: Option<&str> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => out.push((i + 1, blank_code_spans(line))),
            _ => {}
        }
    }
    out
}

/// Inline code (`` `…` ``) replaced by spaces: what is inside is not markup.
fn blank_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(c);
        } else if in_code {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

/// The anchors a Markdown file's headings give (`#` headings; a repeated
/// heading gets `-1`, `-2`, … as on GitHub).
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = HashSet::new();
    let mut fence: Option<&str> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(m) = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m)) {
            fence = match fence {
                None => Some(m),
                Some(open) if open == m => None,
                other => other,
            };
            continue;
        }
        if fence.is_some() || !line.starts_with('#') {
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let Some(title) = line[hashes..].strip_prefix(' ') else {
            continue;
        };
        if hashes > 6 {
            continue;
        }
        let base = slug(title.trim().trim_end_matches('#').trim());
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The link targets on one line: inline links and images `[..](target)`
/// (an optional `"title"` dropped) and reference definitions `[x]: target`.
fn targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let inner = after[..end].trim();
        let target = inner.split_whitespace().next().unwrap_or("");
        let target = target.trim_start_matches('<').trim_end_matches('>');
        if !target.is_empty() {
            out.push(target.to_string());
        }
        rest = &after[end + 1..];
    }
    let t = line.trim_start();
    if t.starts_with('[') {
        if let Some(close) = t.find("]:") {
            if let Some(target) = t[close + 2..].split_whitespace().next() {
                out.push(target.to_string());
            }
        }
    }
    out
}

/// A target with a scheme (`https:`, `mailto:`) is not a file link.
fn is_external(target: &str) -> bool {
    match target.find(':') {
        Some(colon) => {
            let scheme = &target[..colon];
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
                && !target.starts_with('#')
                && !scheme.contains('/')
        }
        None => false,
    }
}

/// `dir/../x` and `./x` resolved without touching the file system; `None`
/// when the path climbs out of the repository.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Every broken link among `files` (paths relative to `root`).
fn check(root: &Path, files: &[String]) -> Vec<Broken> {
    let mut broken = Vec::new();
    let mut anchor_cache: BTreeMap<PathBuf, HashSet<String>> = BTreeMap::new();
    let mut anchors_of = |rel: &Path| -> HashSet<String> {
        anchor_cache
            .entry(rel.to_path_buf())
            .or_insert_with(|| {
                std::fs::read_to_string(root.join(rel))
                    .map(|t| anchors(&t))
                    .unwrap_or_default()
            })
            .clone()
    };
    for file in files {
        let Ok(text) = std::fs::read_to_string(root.join(file)) else {
            broken.push(Broken {
                file: file.clone(),
                line: 0,
                target: String::new(),
                why: "cannot read the file".into(),
            });
            continue;
        };
        let dir = Path::new(file).parent().unwrap_or(Path::new(""));
        for (line, prose) in prose_lines(&text) {
            for target in targets(&prose) {
                if is_external(&target) {
                    continue;
                }
                let (path_part, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let bad = |why: String| Broken {
                    file: file.clone(),
                    line,
                    target: target.clone(),
                    why,
                };
                let rel = if path_part.is_empty() {
                    PathBuf::from(file)
                } else {
                    match normalize(&dir.join(path_part)) {
                        Some(p) => p,
                        None => {
                            broken.push(bad("points outside the repository".into()));
                            continue;
                        }
                    }
                };
                if !root.join(&rel).exists() {
                    broken.push(bad(format!("{} does not exist", rel.display())));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if rel.extension().is_some_and(|e| e == "md") && !anchors_of(&rel).contains(anchor)
                {
                    broken.push(bad(format!(
                        "no heading of {} has the anchor #{anchor}",
                        rel.display()
                    )));
                }
            }
        }
    }
    broken
}

#[test]
fn every_link_in_the_tracked_markdown_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let listed = Command::new("git")
        .args(["ls-files", "-z", "--", "*.md"])
        .current_dir(root)
        .output()
        .expect("the doc-link check lists the Markdown files with `git ls-files`: install git");
    assert!(
        listed.status.success(),
        "git ls-files failed in {} (the doc-link check needs the git checkout): {}",
        root.display(),
        String::from_utf8_lossy(&listed.stderr)
    );
    let files: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .split('\0')
        .filter(|f| !f.is_empty())
        // A file deleted in the work tree but still in the index is not a doc.
        .filter(|f| root.join(f).exists())
        .map(str::to_string)
        .collect();
    assert!(
        files.iter().any(|f| f == "README.md"),
        "no README.md among {files:?}"
    );
    let broken = check(root, &files);
    assert!(
        broken.is_empty(),
        "{} broken doc link(s); fix the link or the heading:\n{}",
        broken.len(),
        broken
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn slugs_are_githubs() {
    for (heading, want) in [
        ("Slurm releases", "slurm-releases"),
        (
            "What sharing did to my job: `muxflow-report`",
            "what-sharing-did-to-my-job-muxflow-report",
        ),
        (
            "Offline jobs in containers (pyxis / enroot)",
            "offline-jobs-in-containers-pyxis--enroot",
        ),
        (
            "Several offline jobs per GPU (N > 1)",
            "several-offline-jobs-per-gpu-n--1",
        ),
        ("Metrics (Prometheus, DCGM)", "metrics-prometheus-dcgm"),
        ("The [replay](sim/README.md) guide", "the-replay-guide"),
        ("k-GPU **offline** jobs", "k-gpu-offline-jobs"),
        ("`[policy] offline_per_gpu`", "policy-offline_per_gpu"),
    ] {
        assert_eq!(slug(heading), want, "{heading}");
    }
}

#[test]
fn repeated_headings_get_numbered_anchors_and_code_is_not_a_heading() {
    let a = anchors("# A\n## Notes\n```\n# not a heading\n```\n## Notes\n####### seven\n");
    let want: HashSet<String> = ["a", "notes", "notes-1"].map(String::from).into();
    assert_eq!(a, want);
}

#[test]
fn a_broken_file_link_or_anchor_is_reported_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("docs")).unwrap();
    std::fs::write(root.join("docs/guide.md"), "# Guide\n## Install it\n").unwrap();
    std::fs::write(
        root.join("README.md"),
        "# Top\n\
         [ok](docs/guide.md) [ok anchor](docs/guide.md#install-it) [self](#top)\n\
         [gone](docs/missing.md)\n\
         [bad anchor](docs/guide.md#install)\n\
         ![img](docs/none.svg) [web](https://example.org/x) `[code](nowhere.md)`\n\
         ```\n[fenced](nowhere.md)\n```\n\
         [out](../outside.md)\n\
         [ref]: docs/absent.md\n",
    )
    .unwrap();
    let got: Vec<(usize, String)> = check(root, &["README.md".into()])
        .into_iter()
        .map(|b| (b.line, b.target))
        .collect();
    assert_eq!(
        got,
        [
            (3, "docs/missing.md"),
            (4, "docs/guide.md#install"),
            (5, "docs/none.svg"),
            (9, "../outside.md"),
            (10, "docs/absent.md"),
        ]
        .map(|(l, t)| (l, t.to_string()))
    );
}
