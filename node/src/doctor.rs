//! `muxflow-doctor`: checks one node's muxflow installation, as root, and
//! prints one line per check — `ok` or `FAIL` with the fix — so an admin (or
//! a script, by the exit status) knows what is wrong before a job finds out.
//!
//! Each check is a function of what it reads (file text, file metadata), so
//! the table tests below feed them broken inputs directly; [`run`] gathers
//! the inputs from the node.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub mod controller;

use muxflow::node::mps::{ComputeCapability, MpsDaemon, ServerMode, MULTIUSER_FLAG};
use muxflow::Config;

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: &'static str,
    /// None: passed.
    pub fix: Option<String>,
    /// What was found (passed) or what is wrong (failed).
    pub detail: String,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Check {
        Check {
            name,
            fix: None,
            detail: detail.into(),
        }
    }

    fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name,
            fix: Some(fix.into()),
            detail: detail.into(),
        }
    }

    /// `ok   NAME: detail` or `FAIL NAME: detail; fix: …`.
    pub fn line(&self) -> String {
        match &self.fix {
            None => format!("ok   {}: {}", self.name, self.detail),
            Some(fix) => format!("FAIL {}: {}; fix: {fix}", self.name, self.detail),
        }
    }
}

/// `Key=value` settings of a slurm.conf-style text (first occurrence, keys
/// compared without case, comments dropped).
pub fn conf_values(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if let Some((k, v)) = line.split_once('=') {
            if !k.contains(char::is_whitespace) {
                out.entry(k.to_ascii_lowercase())
                    .or_insert_with(|| v.trim().to_string());
            }
        }
    }
    out
}

/// The plugstack line that loads muxflow's plugin, from plugstack.conf
/// texts (the file and its `plugstack.conf.d/` includes). `config_in_use`
/// is the muxflow config the node programs read (the doctor's): the
/// plugin's `config=` (default [`muxflow::config::DEFAULT_PATH`]) must name
/// the same file, or the plugin and the Prolog follow different configs.
pub fn check_plugstack(texts: &[(PathBuf, String)], config_in_use: &Path) -> Check {
    const NAME: &str = "plugstack";
    for (path, text) in texts {
        for line in text.lines().map(str::trim) {
            let words: Vec<&str> = line.split_whitespace().collect();
            let Some(so) = words.get(1) else { continue };
            if line.starts_with('#') || !so.ends_with("spank_muxflow.so") {
                continue;
            }
            let at = path.display();
            match words[0] {
                "required" => {}
                // Slurm goes on without an optional plugin that fails to
                // load: offline jobs would then run with no limits at all.
                "optional" => {
                    return Check::fail(
                        NAME,
                        format!("{at}: '{line}' is optional: where the plugin fails to load, jobs run without it, offline jobs unlimited"),
                        "start the line with `required`",
                    )
                }
                other => {
                    return Check::fail(
                        NAME,
                        format!("{at}: '{line}' starts with '{other}'"),
                        "start the line with `required`",
                    )
                }
            }
            if !Path::new(so).is_file() {
                return Check::fail(
                    NAME,
                    format!("{at}: {so} does not exist"),
                    "install the plugin there or correct the path",
                );
            }
            let args =
                match muxflow::config::plugstack::PluginArgs::parse(words[2..].iter().copied()) {
                    Ok(a) => a,
                    Err(e) => {
                        return Check::fail(
                            NAME,
                            format!("{at}: {e}"),
                            "correct the muxflow line's arguments (config=/etc/slurm/muxflow.toml)",
                        )
                    }
                };
            if !same_file(&args.config, config_in_use) {
                return Check::fail(
                    NAME,
                    format!(
                        "{at}: the plugin reads config={}, but the Prolog, Epilog and health check read {}: jobs would be set up by one config and checked by another",
                        args.config.display(),
                        config_in_use.display()
                    ),
                    format!(
                        "set config={} on the plugstack line, then restart the slurmds",
                        config_in_use.display()
                    ),
                );
            }
            return Check::ok(NAME, format!("{at}: {line}"));
        }
    }
    let tried: Vec<String> = texts.iter().map(|(p, _)| p.display().to_string()).collect();
    Check::fail(
        NAME,
        format!("no spank_muxflow.so line in {}", tried.join(", ")),
        "link /usr/share/muxflow/plugstack.conf into plugstack.conf.d/ (or add its line to plugstack.conf)",
    )
}

/// Whether two paths name one file: the same text, or (both existing) the
/// same file once links are followed.
fn same_file(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// `JobSubmitPlugins` loads lua: without it job_submit.lua never runs, so
/// offline jobs are neither parked for the matcher nor given their slot.
pub fn check_job_submit_plugins(slurm_conf: &BTreeMap<String, String>) -> Check {
    const NAME: &str = "job submit";
    let setting = slurm_conf
        .get("jobsubmitplugins")
        .map(String::as_str)
        .unwrap_or("");
    if setting
        .split(',')
        .map(str::trim)
        .any(|p| p == "lua" || p == "job_submit/lua")
    {
        Check::ok(NAME, format!("JobSubmitPlugins={setting}"))
    } else {
        Check::fail(
            NAME,
            format!("JobSubmitPlugins='{setting}' lacks lua: job_submit.lua never runs, so offline jobs are neither parked for the matcher nor given an offline slot"),
            "add lua to JobSubmitPlugins in slurm.conf (JobSubmitPlugins=lua), put /usr/share/muxflow/job_submit.lua beside slurm.conf, and restart slurmctld",
        )
    }
}

/// `GresTypes` names gpu and the offline slot's GRES: Slurm ignores a node's
/// GRES of a type it does not list, so no offline job could be given a slot.
pub fn check_gres_types(slurm_conf: &BTreeMap<String, String>, offline_gres: &str) -> Check {
    const NAME: &str = "gres types";
    let setting = slurm_conf
        .get("grestypes")
        .map(String::as_str)
        .unwrap_or("");
    let listed: Vec<&str> = setting.split(',').map(str::trim).collect();
    let missing: Vec<&str> = ["gpu", offline_gres]
        .into_iter()
        .filter(|t| !listed.contains(t))
        .collect();
    if missing.is_empty() {
        return Check::ok(NAME, format!("GresTypes={setting}"));
    }
    Check::fail(
        NAME,
        format!(
            "GresTypes='{setting}' lacks {}: Slurm knows no such GRES, so offline jobs cannot be given a slot",
            missing.join(" and ")
        ),
        format!("set GresTypes=gpu,{offline_gres} in slurm.conf (with any other types the site uses) and restart slurmctld and the slurmds"),
    )
}

/// This node's definition in slurm.conf: the `Gres=` of the `NodeName=`
/// line naming it (or of the `NodeName=DEFAULT` line before it); None when
/// no line names it.
pub fn node_gres(slurm_conf_text: &str, node: &str) -> Option<String> {
    let mut default_gres = String::new();
    for line in slurm_conf_text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let kv: Vec<(String, &str)> = line
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect();
        let Some(("nodename", names)) = kv.first().map(|(k, v)| (k.as_str(), *v)) else {
            continue;
        };
        let gres = kv.iter().find(|(k, _)| k == "gres").map(|(_, v)| *v);
        if names.eq_ignore_ascii_case("DEFAULT") {
            default_gres = gres.unwrap_or("").to_string();
        } else if hostlist_contains(names, node) {
            return Some(gres.map_or_else(|| default_gres.clone(), str::to_string));
        }
    }
    None
}

/// The `node` line: whether slurm.conf defines this node at all (the
/// checks of its gres.conf lines mean nothing otherwise).
pub fn check_node_defined(node: &str, slurm_conf: &Path, found: bool) -> Check {
    if found {
        return Check::ok(
            "node",
            format!("NodeName={node} in {}", slurm_conf.display()),
        );
    }
    Check::fail(
        "node",
        format!(
            "no NodeName={node} in {} (nor its Includes): this host is not a Slurm node by that name",
            slurm_conf.display()
        ),
        "pass --node NAME (this node's NodeName in slurm.conf); on the controller host, run muxflow-doctor --controller",
    )
}

/// The Slurm this build is for against the installed slurmd's
/// (`slurmd -V`: `slurm-wlm 22.05.8`); Slurm loads no plugin of another
/// major.minor.
pub fn check_slurm_version(built: &str, slurmd_v: &str) -> Check {
    const NAME: &str = "slurm version";
    let minor = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
    let installed = slurmd_v.split_whitespace().nth(1).unwrap_or("");
    if installed.is_empty() {
        return Check::fail(
            NAME,
            format!("cannot tell the installed Slurm from '{}'", slurmd_v.trim()),
            "install slurmd on this node",
        );
    }
    if minor(installed) != minor(built) {
        return Check::fail(
            NAME,
            format!("muxflow was built for Slurm {built}, slurmd is {installed}: Slurm will not load the plugin"),
            format!("install the muxflow packages built for Slurm {}", minor(installed)),
        );
    }
    Check::ok(NAME, format!("built for {built}, slurmd {installed}"))
}

/// Whether a slurm.conf program setting runs `program` (`muxflow-prolog`):
/// the setting itself, or a script of its `dir/*` drop-in directory that
/// calls it (`scripts`: their names and texts).
fn runs(setting: &str, program: &str, scripts: &[(PathBuf, String)]) -> bool {
    setting.split(',').any(|p| p.trim().ends_with(program))
        || scripts.iter().any(|(_, text)| text.contains(program))
}

/// Prolog, Epilog, HealthCheckProgram (or an NHC check) and PrologFlags.
pub fn check_wiring(
    slurm_conf: &BTreeMap<String, String>,
    prolog_scripts: &[(PathBuf, String)],
    epilog_scripts: &[(PathBuf, String)],
    nhc_check: bool,
) -> Vec<Check> {
    let get = |k: &str| slurm_conf.get(k).map(String::as_str).unwrap_or("");
    let mut out = Vec::new();
    for (name, key, program, scripts) in [
        ("prolog", "prolog", "muxflow-prolog", prolog_scripts),
        ("epilog", "epilog", "muxflow-epilog", epilog_scripts),
    ] {
        let setting = get(key);
        out.push(if runs(setting, program, scripts) {
            Check::ok(
                name,
                format!("{}={setting} runs {program}", capitalized(key)),
            )
        } else {
            Check::fail(
                name,
                format!("{}='{setting}' does not run {program}", capitalized(key)),
                format!(
                    "set {}=/etc/slurm/{key}.d/* and install etc/{key}.d/50-muxflow there",
                    capitalized(key)
                ),
            )
        });
    }
    let health = get("healthcheckprogram");
    out.push(if health.ends_with("muxflow-health") || nhc_check {
        Check::ok(
            "health check",
            if nhc_check {
                "NHC runs check_muxflow".to_string()
            } else {
                format!("HealthCheckProgram={health}")
            },
        )
    } else {
        Check::fail(
            "health check",
            format!("HealthCheckProgram='{health}' and no NHC check_muxflow"),
            "set HealthCheckProgram=/usr/sbin/muxflow-health, or with NHC install etc/nhc/muxflow.nhc",
        )
    });
    let flags = get("prologflags");
    out.push(
        if flags
            .split(',')
            .any(|f| f.trim().eq_ignore_ascii_case("alloc"))
        {
            Check::ok("prolog flags", format!("PrologFlags={flags}"))
        } else {
            Check::fail(
                "prolog flags",
                format!("PrologFlags='{flags}' lacks Alloc: the MPS daemon would start after the job's first step"),
                "add Alloc to PrologFlags",
            )
        },
    );
    out
}

fn capitalized(key: &str) -> String {
    let mut c = key.chars();
    c.next()
        .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
        .unwrap_or_default()
}

/// `/dev/nvidia[0-1]` → `/dev/nvidia0`, `/dev/nvidia1` (one bracket range).
fn expand_files(spec: &str) -> Vec<String> {
    let Some((head, rest)) = spec.split_once('[') else {
        return vec![spec.to_string()];
    };
    let Some((ranges, tail)) = rest.split_once(']') else {
        return vec![spec.to_string()];
    };
    let mut out = Vec::new();
    for r in ranges.split(',') {
        let (a, z) = r.split_once('-').unwrap_or((r, r));
        // Slurm keeps a range's zero padding: gpu[01-04] is gpu01..gpu04.
        let width = if a.starts_with('0') { a.len() } else { 0 };
        if let (Ok(a), Ok(z)) = (a.parse::<u32>(), z.parse::<u32>()) {
            out.extend((a..=z.min(a + 1024)).map(|i| format!("{head}{i:0width$}{tail}")));
        }
    }
    out
}

/// Where a gres.conf `File=` leads: links followed (up to 8; a slot beyond
/// a GPU's first names a link to its device file, etc/gres-muxflow), the
/// path itself where it is no link or cannot be read.
pub fn device_behind(path: &str) -> String {
    let mut p = PathBuf::from(path);
    for _ in 0..8 {
        match std::fs::read_link(&p) {
            Ok(target) if target.is_absolute() => p = target,
            Ok(target) => p = p.parent().unwrap_or(Path::new("/")).join(target),
            Err(_) => break,
        }
    }
    p.display().to_string()
}

/// gres.conf: every GPU file of `node` has exactly `per_gpu` `offline_gres`
/// slots (`[policy] offline_per_gpu`) typed `g<i>`, each naming a file
/// that is the GPU's or leads to it (`resolve`: [`device_behind`]), no
/// file named twice: Slurm 26.05's slurmd refuses that ("duplicate device
/// file name"), so slots beyond the first name links.
pub fn check_gres(
    text: &str,
    node: &str,
    offline_gres: &str,
    per_gpu: u8,
    resolve: impl Fn(&str) -> String,
) -> Check {
    const NAME: &str = "gres.conf";
    let mut gpus: Vec<String> = Vec::new();
    // GPU file -> (type, file named) of each slot record leading there.
    let mut slots: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for r in gres_records(text, node) {
        match r.name.as_str() {
            "gpu" => gpus.extend(r.files),
            n if n == offline_gres => {
                for f in r.files {
                    slots
                        .entry(resolve(&f))
                        .or_default()
                        .push((r.ty.clone(), f));
                }
            }
            _ => {}
        }
    }
    if gpus.is_empty() {
        return Check::fail(
            NAME,
            format!("no Name=gpu line for {node}"),
            "list the GPUs (etc/gres-muxflow prints the lines)",
        );
    }
    let generator = format!(
        "etc/gres-muxflow --per-gpu {per_gpu} --make-links prints them and makes the links"
    );
    for (i, file) in gpus.iter().enumerate() {
        let want = format!("g{i}");
        let records = slots
            .get(&resolve(file))
            .map(Vec::as_slice)
            .unwrap_or_default();
        let types: Vec<&str> = records.iter().map(|(t, _)| t.as_str()).collect();
        if records.is_empty() {
            return Check::fail(
                NAME,
                format!("GPU {i} ({file}) has no {offline_gres} slot"),
                format!("add `Name={offline_gres} Type={want} File={file}` (etc/gres-muxflow prints the lines)"),
            );
        }
        if types.len() != usize::from(per_gpu) || types.iter().any(|t| *t != want) {
            return Check::fail(
                NAME,
                format!("{file}: {offline_gres} slots typed {types:?}, expected {per_gpu} typed {want} ([policy] offline_per_gpu = {per_gpu})"),
                format!("give GPU {i} {per_gpu} `Name={offline_gres} Type={want}` line(s), the first `File={file}`, the others links to it ({generator})"),
            );
        }
        let mut named: Vec<&str> = records.iter().map(|(_, f)| f.as_str()).collect();
        named.sort_unstable();
        if let Some(twice) = named.windows(2).find(|w| w[0] == w[1]) {
            return Check::fail(
                NAME,
                format!("{file}: {} is named by several {offline_gres} lines, which Slurm 26.05 refuses (\"duplicate device file name\": slurmd exits)", twice[0]),
                format!("name a link to {file} in each slot line beyond the first ({generator})"),
            );
        }
    }
    Check::ok(
        NAME,
        format!("{} GPUs, {per_gpu} {offline_gres} slot(s) each", gpus.len()),
    )
}

/// One gres.conf line that applies to a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GresRecord {
    pub name: String,
    /// `Type=`, empty when none.
    pub ty: String,
    /// `File=`, its bracket range expanded.
    pub files: Vec<String>,
    /// `Count=`, else the number of files, else 1.
    pub count: u64,
}

/// gres.conf's lines for `node`: those without `NodeName=` and those whose
/// `NodeName=` names it (comments dropped, keys without case).
pub fn gres_records(text: &str, node: &str) -> Vec<GresRecord> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let kv: BTreeMap<String, String> = line
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
            .collect();
        if let Some(nodes) = kv.get("nodename") {
            if !hostlist_contains(nodes, node) {
                continue;
            }
        }
        let Some(name) = kv.get("name") else { continue };
        let files = kv.get("file").map(|f| expand_files(f)).unwrap_or_default();
        let count = kv
            .get("count")
            .and_then(|c| c.parse().ok())
            .unwrap_or(files.len().max(1) as u64);
        out.push(GresRecord {
            name: name.clone(),
            ty: kv.get("type").cloned().unwrap_or_default(),
            files,
            count,
        });
    }
    out
}

/// GPUs and offline slots per type (`g0` → 1) that a GRES text counts.
type GresCounts = (u64, BTreeMap<String, u64>);

/// Counts of slurm.conf's `Gres=gpu:2,mfslot:g0:1,mfslot:g1:1` (a GPU type
/// and a `(S:0-1)` socket suffix allowed: `gpu:a100:4(S:0-1)`).
fn slurm_gres_counts(gres: &str, offline_gres: &str) -> GresCounts {
    let mut gpus = 0;
    let mut slots = BTreeMap::new();
    let mut depth = 0;
    let mut start = 0;
    let b = gres.as_bytes();
    for i in 0..=b.len() {
        match b.get(i) {
            Some(b'(') => depth += 1,
            Some(b')') => depth -= 1,
            Some(b',') | None if depth == 0 => {
                let entry = gres[start..i].split('(').next().unwrap_or("").trim();
                start = i + 1;
                let parts: Vec<&str> = entry.split(':').collect();
                let (name, ty, count) = match parts.as_slice() {
                    [n] => (*n, "", Some(1)),
                    [n, c] if c.parse::<u64>().is_ok() => (*n, "", c.parse().ok()),
                    [n, t] => (*n, *t, Some(1)),
                    [n, t, c, ..] => (*n, *t, c.parse().ok()),
                    _ => continue,
                };
                let count = count.unwrap_or(0);
                if name == "gpu" {
                    gpus += count;
                } else if name == offline_gres {
                    *slots.entry(ty.to_string()).or_insert(0) += count;
                }
            }
            _ => {}
        }
    }
    (gpus, slots)
}

fn gres_conf_counts(records: &[GresRecord], offline_gres: &str) -> GresCounts {
    let mut gpus = 0;
    let mut slots = BTreeMap::new();
    for r in records {
        if r.name == "gpu" {
            gpus += r.count;
        } else if r.name == offline_gres {
            *slots.entry(r.ty.clone()).or_insert(0) += r.count;
        }
    }
    (gpus, slots)
}

/// `gpu:2,mfslot:g0:1,mfslot:g1:1` of counts.
fn gres_string((gpus, slots): &GresCounts, offline_gres: &str) -> String {
    let mut out = format!("gpu:{gpus}");
    for (ty, n) in slots {
        out.push_str(&format!(",{offline_gres}:{ty}:{n}"));
    }
    out
}

/// slurm.conf's `Gres=` for `node` against its gres.conf lines: the same
/// number of GPUs and of offline slots of each type. slurmd registers what
/// gres.conf has; slurmctld drains a node that has less than slurm.conf
/// says, and never offers what slurm.conf leaves out.
pub fn check_gres_agreement(
    node: &str,
    slurm_gres: &str,
    gres_conf: &str,
    offline_gres: &str,
) -> Check {
    const NAME: &str = "slurm.conf gres";
    let said = slurm_gres_counts(slurm_gres, offline_gres);
    let has = gres_conf_counts(&gres_records(gres_conf, node), offline_gres);
    if said == has {
        return Check::ok(
            NAME,
            format!("NodeName={node} Gres={slurm_gres} matches gres.conf"),
        );
    }
    let has_text = gres_string(&has, offline_gres);
    Check::fail(
        NAME,
        format!(
            "NodeName={node} has Gres='{slurm_gres}' ({}) but gres.conf lists {has_text} for it: slurmctld drains a node with less than slurm.conf says and offers nothing slurm.conf leaves out",
            gres_string(&said, offline_gres)
        ),
        format!("set Gres={has_text} on NodeName={node} in slurm.conf (or correct gres.conf: etc/gres-muxflow prints both), then restart slurmctld and the node's slurmd"),
    )
}

/// Whether a Slurm hostlist (`node[1-4],gpu7`) names `node`.
pub fn hostlist_contains(list: &str, node: &str) -> bool {
    if list.eq_ignore_ascii_case("ALL") {
        return true;
    }
    let mut depth = 0;
    let mut start = 0;
    let b = list.as_bytes();
    for i in 0..=b.len() {
        match b.get(i) {
            Some(b'[') => depth += 1,
            Some(b']') => depth -= 1,
            Some(b',') | None if depth == 0 => {
                let part = &list[start..i];
                start = i + 1;
                if expand_files(part).iter().any(|n| n == node) {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

/// What matters of a path for root's trust: owner and mode, of it and of
/// each directory above it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owned {
    pub uid: u32,
    pub mode: u32,
}

fn owned(path: &Path) -> std::io::Result<Owned> {
    let m = std::fs::metadata(path)?;
    Ok(Owned {
        uid: m.uid(),
        mode: m.mode(),
    })
}

/// A root-trusted path: root-owned and writable by no one else, itself and
/// every directory above it (a sticky world-writable directory such as
/// /tmp still lets another user replace what is not theirs only if they
/// own it, so it is refused too).
pub fn check_root_owned(
    name: &'static str,
    path: &Path,
    chain: &[(PathBuf, std::io::Result<Owned>)],
) -> Check {
    for (p, o) in chain {
        match o {
            Err(e) => {
                return Check::fail(
                    name,
                    format!("{}: {e}", p.display()),
                    format!(
                        "install it at {} or correct paths in muxflow.toml",
                        path.display()
                    ),
                )
            }
            Ok(o) if o.uid != 0 => {
                return Check::fail(
                    name,
                    format!("{} is owned by uid {}, not root", p.display(), o.uid),
                    format!("chown root:root {}", p.display()),
                )
            }
            Ok(o) if o.mode & 0o022 != 0 => {
                return Check::fail(
                    name,
                    format!(
                        "{} is writable by others (mode {:04o})",
                        p.display(),
                        o.mode & 0o7777
                    ),
                    format!("chmod go-w {}", p.display()),
                )
            }
            Ok(_) => {}
        }
    }
    Check::ok(
        name,
        format!("{} root-owned, not writable by others", path.display()),
    )
}

/// `path` and each directory above it, with their owner and mode.
pub fn chain(path: &Path) -> Vec<(PathBuf, std::io::Result<Owned>)> {
    path.ancestors()
        .map(|p| (p.to_path_buf(), owned(p)))
        .collect()
}

/// An executable file (the MPS control program).
pub fn check_executable(name: &'static str, path: &Path, setting: &str) -> Check {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.mode() & 0o111 != 0 => {
            Check::ok(name, format!("{}", path.display()))
        }
        Ok(_) => Check::fail(
            name,
            format!("{} is not an executable file", path.display()),
            format!("chmod 755 it, or correct {setting} in muxflow.toml"),
        ),
        Err(e) => Check::fail(
            name,
            format!("{}: {e}", path.display()),
            format!("install the NVIDIA driver utilities, or correct {setting} in muxflow.toml"),
        ),
    }
}

/// What the doctor is run with: the muxflow config and where it was
/// found, and the slurm.conf in use.
pub struct Inputs<'a> {
    pub config: &'a Config,
    pub config_path: &'a Path,
    pub slurm_conf: &'a Path,
}

/// Everything, for node `node` and the installed `slurmd -V` answer.
pub fn run(inputs: &Inputs, node: &str, slurmd_v: &str) -> Vec<Check> {
    let mut checks = Vec::new();
    slurm_checks(&mut checks, inputs, node, slurmd_v);
    gpu_checks(&mut checks, inputs.config);
    directory_checks(&mut checks, inputs.config);
    checks
}

/// A file's text, empty where it cannot be read (its check says what is missing).
fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// slurm.conf's text with its `Include` files in place (relative to its
/// directory, a few levels deep): node lines often live in an include.
pub fn slurm_conf_text(path: &Path) -> String {
    fn expand(path: &Path, dir: &Path, depth: u8, out: &mut String) {
        for line in read(path).lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [kw, file] if kw.eq_ignore_ascii_case("include") && depth < 4 => {
                    let f = Path::new(file);
                    expand(&dir.join(f), dir, depth + 1, out);
                }
                _ => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
    }
    let mut out = String::new();
    let dir = path.parent().unwrap_or(Path::new("/"));
    expand(path, dir, 0, &mut out);
    out
}

/// Slurm's side: plugstack.conf and its includes, the release the build is
/// for, job_submit and GresTypes, the Prolog/Epilog/health wiring, this
/// node's definition, gres.conf and its agreement with slurm.conf.
fn slurm_checks(checks: &mut Vec<Check>, inputs: &Inputs, node: &str, slurmd_v: &str) {
    let config = inputs.config;
    let slurm_conf = inputs.slurm_conf;
    let conf_dir = slurm_conf.parent().unwrap_or(Path::new("/"));
    let text = slurm_conf_text(slurm_conf);
    let conf = conf_values(&text);
    let rel = |v: Option<&String>, default: &str| {
        let p = PathBuf::from(v.map(String::as_str).unwrap_or(default));
        if p.is_absolute() {
            p
        } else {
            conf_dir.join(p)
        }
    };

    // plugstack.conf and its plugstack.conf.d/ includes.
    let plugstack = rel(conf.get("plugstackconfig"), "plugstack.conf");
    let mut texts = vec![(plugstack.clone(), read(&plugstack))];
    if let Ok(dir) = std::fs::read_dir(plugstack.with_extension("conf.d")) {
        let mut files: Vec<PathBuf> = dir.flatten().map(|e| e.path()).collect();
        files.sort();
        texts.extend(files.into_iter().map(|p| {
            let t = read(&p);
            (p, t)
        }));
    }
    checks.push(check_plugstack(&texts, inputs.config_path));
    checks.push(check_slurm_version(
        &muxflow_slurm::version::version_string(),
        slurmd_v,
    ));
    checks.push(check_job_submit_plugins(&conf));
    checks.push(check_gres_types(&conf, &config.slurm.offline_gres));

    // Prolog/Epilog drop-in directories: the scripts a glob names.
    let scripts = |key: &str| -> Vec<(PathBuf, String)> {
        let setting = conf.get(key).cloned().unwrap_or_default();
        let Some(dir) = setting.strip_suffix("/*") else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        files
            .into_iter()
            .map(|p| {
                let t = read(&p);
                (p, t)
            })
            .collect()
    };
    let nhc = read(Path::new("/etc/nhc/nhc.conf")).contains("check_muxflow");
    checks.extend(check_wiring(
        &conf,
        &scripts("prolog"),
        &scripts("epilog"),
        nhc,
    ));

    let node_gres = node_gres(&text, node);
    checks.push(check_node_defined(node, slurm_conf, node_gres.is_some()));
    // Not a node by that name: its gres.conf lines would be judged for
    // another host, and say nothing true.
    let Some(node_gres) = node_gres else { return };
    let gres = conf_dir.join("gres.conf");
    match std::fs::read_to_string(&gres) {
        Ok(text) => {
            let own = check_gres(
                &text,
                node,
                &config.slurm.offline_gres,
                config.policy.offline_per_gpu,
                device_behind,
            );
            let own_failed = own.fix.is_some();
            checks.push(own);
            // gres.conf wrong on its own: its fix comes first, and the
            // comparison with slurm.conf would say the same thing again.
            if own_failed {
                return;
            }
            checks.push(check_gres_agreement(
                node,
                &node_gres,
                &text,
                &config.slurm.offline_gres,
            ));
        }
        Err(e) => checks.push(Check::fail(
            "gres.conf",
            format!("{}: {e}", gres.display()),
            "write gres.conf (etc/gres-muxflow prints it)",
        )),
    }
}

/// The GPUs' side: the MPS control program, NVML, MPS v3, the driver's and
/// kernel's mechanisms, SM partitions, each GPU's multi-user mode.
fn gpu_checks(checks: &mut Vec<Check>, config: &Config) {
    checks.push(check_executable(
        "mps control",
        config.paths.mps_control.as_path(),
        "paths.mps_control",
    ));
    let nvml_lib = config.paths.nvml_library.as_ref().map(|p| p.as_path());
    let (gpus, pci): (Vec<u32>, Vec<(u32, crate::kmsg::Pci)>) =
        match crate::nvml::read(nvml_lib, std::time::Duration::ZERO) {
            Ok(t) => {
                checks.push(Check::ok("nvml", format!("{} GPUs", t.gpus.len())));
                (t.gpus.iter().map(|(i, _)| *i).collect(), t.pci)
            }
            Err(e) => {
                checks.push(Check::fail(
                    "nvml",
                    e.to_string(),
                    "install the NVIDIA driver (libnvidia-ml.so.1), or correct paths.nvml_library",
                ));
                (Vec::new(), Vec::new())
            }
        };
    let lowest_cc = gpus
        .iter()
        .filter_map(|&g| crate::gpu_caps::compute_capability(config, g))
        .min();
    let bus_ids: Vec<String> = pci
        .iter()
        .map(|(_, (domain, bus, device))| format!("{domain:04x}:{bus:02x}:{device:02x}.0"))
        .collect();
    // GPUs whose running daemon was started without static partitions.
    let without_static: Vec<u32> = gpus
        .iter()
        .copied()
        .filter(|&g| {
            let d = MpsDaemon::for_gpu(config, g);
            config.mps.sm_partitions && d.is_running() && !d.runs_static_partitions()
        })
        .collect();
    let version = crate::gpu_caps::mps_control_version(config);
    // GPUs whose running daemon speaks v2 where v3 is to be used.
    let not_v3: Vec<u32> = gpus
        .iter()
        .copied()
        .filter(|&g| {
            let d = MpsDaemon::for_gpu(config, g);
            crate::gpu_caps::mps_protocol_wanted(config) == muxflow::node::mps_v3::Protocol::V3
                && d.is_running()
                && d.protocol() != muxflow::node::mps_v3::Protocol::V3
        })
        .collect();
    checks.push(check_mps_v3(version, config.mps.sm_partitions, &not_v3));
    checks.extend(check_mechanisms(
        &dmem_found(config.paths.cgroup_root.as_path()),
        &bus_ids,
    ));
    checks.push(check_sm_partitions(
        config.mps.sm_partitions,
        version,
        lowest_cc,
        &without_static,
    ));
    for gpu in gpus {
        let mps = MpsDaemon::for_gpu(config, gpu);
        let facts = crate::gpu_caps::device_facts(config, gpu);
        checks.push(check_mps_device(
            gpu,
            facts.uuid.as_deref(),
            mps.noted_device().as_deref(),
            mps.is_running(),
        ));
        let cc = facts.cc;
        checks.push(check_multiuser(
            gpu,
            config.mps.multiuser,
            cc,
            mps.serves_all_users(),
            mps.mode_note().as_deref(),
        ));
    }
}

/// xCUDA and the state, pipe and log directories: root-owned, not writable
/// by users.
fn directory_checks(checks: &mut Vec<Check>, config: &Config) {
    let xcuda = config.paths.xcuda_library.as_path();
    checks.push(check_root_owned("xcuda", xcuda, &chain(xcuda)));
    for (name, dir) in [
        ("state dir", config.paths.state_dir.as_path()),
        ("mps pipe dir", config.paths.mps_pipe_root.as_path()),
        ("mps log dir", config.paths.mps_log_root.as_path()),
    ] {
        // Not there yet: the first Prolog makes it, root-owned.
        let existing = dir
            .ancestors()
            .find(|p| p.exists())
            .unwrap_or(Path::new("/"));
        let mut c = check_root_owned(name, existing, &chain(existing));
        if existing != dir && c.fix.is_none() {
            c.detail = format!("{} (made by the first Prolog)", dir.display());
        }
        checks.push(c);
    }
    checks.push(check_pipe_access(config.paths.mps_pipe_root.as_path()));
}

/// Whether the filesystem of the MPS pipe directories keeps ACLs, so that
/// only users with a job on a GPU reach its daemon
/// (muxflow::node::pipe_access): tried on a directory the doctor makes
/// there and removes.
fn check_pipe_access(root: &Path) -> Check {
    use muxflow::node::pipe_access::{admit_only, Access};
    const NAME: &str = "mps access";
    let existing = root
        .ancestors()
        .find(|p| p.is_dir())
        .unwrap_or(Path::new("/"));
    let probe = existing.join(format!(".muxflow-doctor-acl-{}", std::process::id()));
    let tried = std::fs::create_dir(&probe)
        .map_err(|e| e.to_string())
        .and_then(|()| admit_only(&probe, &[65534].into()).map_err(|e| e.to_string()));
    let _ = std::fs::remove_dir(&probe);
    match tried {
        Ok(Access::Users(_)) => Check::ok(
            NAME,
            format!(
                "{}: a GPU's MPS daemon is reached only by users with a job on it (the pipe directory's ACL)",
                root.display()
            ),
        ),
        Ok(Access::Open) => Check::fail(
            NAME,
            format!(
                "{} keeps no ACLs: every user on the node reaches every GPU's MPS daemon and can send it commands (terminate_client, quit)",
                existing.display()
            ),
            "put paths.mps_pipe_root on a filesystem with POSIX ACLs (tmpfs with CONFIG_TMPFS_POSIX_ACL, ext4, xfs); jobs run either way, the police judge every client".to_string(),
        ),
        Err(e) => Check::fail(
            NAME,
            format!("cannot try an ACL in {}: {e}", existing.display()),
            "run muxflow-doctor as root".to_string(),
        ),
    }
}

/// GPU `gpu`'s MPS multi-user mode: whether jobs of different users can
/// share it. `running`: what the daemon's command line (or muxflow's note
/// of how it started it) says, None when none was ever started; `note`:
/// that note. Deliberate or hardware-bound single-user mode passes with
/// what it means; a daemon that refused the flag, or runs without it
/// against the config, fails with the fix.
pub fn check_multiuser(
    gpu: u32,
    asked: bool,
    cc: Option<ComputeCapability>,
    running: Option<bool>,
    note: Option<&str>,
) -> Check {
    let cc_words = cc.map_or("compute capability unknown".to_string(), |c| {
        format!("compute capability {c}")
    });
    let plan = ServerMode::plan(asked, cc);
    match (&plan, running) {
        (ServerMode::MultiUser, Some(true)) => Check::ok(
            "mps multiuser",
            format!("GPU {gpu}: the daemon runs with {MULTIUSER_FLAG}, by its command line ({cc_words}): jobs of different users share it"),
        ),
        (ServerMode::MultiUser, None) => Check::ok(
            "mps multiuser",
            format!("GPU {gpu}: the first Prolog starts the daemon with {MULTIUSER_FLAG} ({cc_words})"),
        ),
        (ServerMode::MultiUser, Some(false)) => Check::fail(
            "mps multiuser",
            format!(
                "GPU {gpu}: the daemon serves one user at a time ({}): jobs of different users never share this GPU",
                note.map_or("started without the flag".to_string(), |n| n.trim().to_string())
            ),
            format!(
                "check that the driver supports multi-user MPS on this GPU (nvidia-cuda-mps-control -d {MULTIUSER_FLAG} as root; see the MPS log), then stop the daemon while the GPU has no job (echo quit | nvidia-cuda-mps-control with its CUDA_MPS_PIPE_DIRECTORY); or set [mps] multiuser = false to accept it"
            ),
        ),
        (ServerMode::SingleUser(why), _) => Check::ok(
            "mps multiuser",
            format!("GPU {gpu}: one user at a time ({why}): the matcher pairs only jobs of one user here"),
        ),
    }
}

/// The `mps device` line of GPU `gpu`: how its daemon and its clients name
/// it. `nvml`: the GPU's UUID now; `noted`: the device muxflow gave the
/// daemon it last started ([`MpsDaemon::noted_device`]); `running`: a
/// daemon answers. A daemon renumbers its devices from 0, so both sides
/// must name the GPU by UUID (or the client by 0); a daemon started for
/// another UUID than NVML's serves another GPU than the one jobs are
/// placed on.
pub fn check_mps_device(gpu: u32, nvml: Option<&str>, noted: Option<&str>, running: bool) -> Check {
    let name = "mps device";
    let state = if running { "runs" } else { "ran last" };
    match (noted, nvml) {
        (Some(n), Some(u)) if muxflow::node::mps::is_uuid(n) && n != u => Check::fail(
            name,
            format!("GPU {gpu}: its daemon {state} for {n}, but NVML names GPU {gpu} {u} (GPUs renumbered or replaced): its jobs would run on another GPU"),
            "stop that daemon while its GPU has no job (echo quit | nvidia-cuda-mps-control with its CUDA_MPS_PIPE_DIRECTORY): the next job's Prolog starts it for the GPU's UUID",
        ),
        (Some(n), _) if muxflow::node::mps::is_uuid(n) => Check::ok(
            name,
            format!("GPU {gpu}: its daemon {state} with CUDA_VISIBLE_DEVICES={n}; every client (online, offline, each task of a gang) is given {n}"),
        ),
        (Some(n), _) => Check::ok(
            name,
            format!("GPU {gpu}: NVML gave no UUID when its daemon started, so it {state} with CUDA_VISIBLE_DEVICES={n} and shows that GPU as device 0; clients are given 0"),
        ),
        (None, _) if running => Check::ok(
            name,
            format!("GPU {gpu}: a daemon muxflow did not note (started by hand or by an older muxflow, with the GPU's index): it shows its GPU as device 0, and clients are given 0; stopped while the GPU has no job, the next Prolog starts it by UUID"),
        ),
        (None, Some(u)) => Check::ok(
            name,
            format!("GPU {gpu}: no daemon yet; the first Prolog starts it with CUDA_VISIBLE_DEVICES={u}, and every client is given {u}"),
        ),
        (None, None) => Check::fail(
            name,
            format!("GPU {gpu}: NVML gives no UUID: its daemon would be started by index, and a client outside MPS would be given device 0, another GPU"),
            "check the NVIDIA driver (nvidia-smi -L lists each GPU's UUID) or paths.nvml_library",
        ),
    }
}

/// What the node's cgroup v2 mount says of the `dmem` controller.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DmemFound {
    /// The regions of `dmem.capacity`; None without the controller.
    pub regions: Option<Vec<(String, u64)>>,
    /// Whether Slurm's parent of the job cgroups
    /// ([`muxflow::node::dmem::SLURM_JOBS_PARENT`]) offers the controller to them;
    /// None when that cgroup is not there (no job yet, or another layout).
    pub jobs_parent_offers: Option<bool>,
}

/// Reads [`DmemFound`] under `cgroup_root`.
pub fn dmem_found(cgroup_root: &Path) -> DmemFound {
    let parent = cgroup_root.join(muxflow::node::dmem::SLURM_JOBS_PARENT);
    DmemFound {
        regions: muxflow::node::dmem::regions(cgroup_root),
        jobs_parent_offers: std::fs::read_to_string(parent.join("cgroup.controllers"))
            .ok()
            .map(|t| muxflow::node::dmem::lists_dmem(&t)),
    }
}

/// The `dmem` line: absent (xCUDA's cap and the police), used for the
/// GPUs whose region the driver registers, or broken where the controller
/// is there but not offered to Slurm's job cgroups (with the fix).
pub fn check_dmem(found: &DmemFound, bus_ids: &[String]) -> Check {
    let Some(regions) = &found.regions else {
        return Check::ok(
            "dmem",
            "absent: no cgroup v2 dmem controller (kernel 6.14+); GPU memory caps are xCUDA's and the police's",
        );
    };
    let named = bus_ids
        .iter()
        .filter(|b| muxflow::node::dmem::region_of(regions, b).is_some())
        .count();
    if found.jobs_parent_offers == Some(false) {
        return Check::fail(
            "dmem",
            format!(
                "the kernel has the controller, but {} does not offer it to the job cgroups: GPU memory caps stay xCUDA's",
                muxflow::node::dmem::SLURM_JOBS_PARENT
            ),
            format!(
                "enable it down to the job cgroups: echo +dmem > cgroup.subtree_control in the cgroup root, system.slice and {}",
                muxflow::node::dmem::SLURM_JOBS_PARENT
            ),
        );
    }
    let detail = match named {
        0 => format!(
            "absent for this node's GPUs: the controller is there but the driver registers none of the node's {} GPUs ({} regions); GPU memory caps are xCUDA's and the police's",
            bus_ids.len(),
            regions.len()
        ),
        n => format!(
            "used: an offline job's GPU memory cap goes into its cgroup's dmem.max (enforced by the kernel) on {n} of the node's {} GPUs{}",
            bus_ids.len(),
            if n < bus_ids.len() { "; the others: xCUDA's and the police's" } else { "" }
        ),
    };
    Check::ok("dmem", detail)
}

/// Static SM partitions need control daemon 13010+ (CUDA 13.1) and Ampere.
pub const SM_PARTITIONS_MIN_VERSION: u32 = muxflow::node::sm_partition::MIN_VERSION;

/// The `sm partitions` line: used (`[mps] sm_partitions` on, a daemon and
/// GPUs that have them), available but off, absent (the SM share stays
/// MPS's active-thread percentage and xCUDA's), or broken: asked for, but
/// a running daemon was started without `-S` (`without_static`: its GPUs).
pub fn check_sm_partitions(
    configured: bool,
    version: Option<u32>,
    lowest_cc: Option<ComputeCapability>,
    without_static: &[u32],
) -> Check {
    let v = version.map_or(
        "a control daemon whose -v names no version".to_string(),
        |v| format!("control daemon {v}, by its -v"),
    );
    let there = version.is_some_and(|v| v >= SM_PARTITIONS_MIN_VERSION)
        && lowest_cc.is_some_and(|c| c.major >= 8);
    let name = "sm partitions";
    match (there, configured) {
        (false, _) => Check::ok(
            name,
            format!(
                "absent ({v}; needs {SM_PARTITIONS_MIN_VERSION}+ and Ampere or newer): an offline job's SM share is its MPS active-thread percentage and xCUDA's (policed){}",
                if configured { "; [mps] sm_partitions is set and ignored here" } else { "" }
            ),
        ),
        (true, false) => Check::ok(
            name,
            format!("available ({v}, Ampere or newer), off: set [mps] sm_partitions = true to have the driver hold each job to its SMs"),
        ),
        (true, true) if !without_static.is_empty() => Check::fail(
            name,
            format!(
                "[mps] sm_partitions is set, but the daemon of GPU {:?} runs without -S: its jobs' SM shares stay MPS's active-thread percentage and xCUDA's",
                without_static
            ),
            "stop that daemon while its GPU has no job (echo quit | nvidia-cuda-mps-control with its CUDA_MPS_PIPE_DIRECTORY): the next job's Prolog starts it with -S",
        ),
        (true, true) => Check::ok(
            name,
            format!("used ({v}): daemons start with -S; each job gets its own partition and the driver holds an offline job to its SMs (enforced_by_sm=driver)"),
        ),
    }
}
/// What the kernel could enforce itself on this node: the cgroup `dmem`
/// memory limit (`regions`: its `dmem.capacity`, None without the
/// controller; `bus_ids`: the GPUs' PCI addresses, lowercase).
pub fn check_mechanisms(dmem: &DmemFound, bus_ids: &[String]) -> Vec<Check> {
    vec![check_dmem(dmem, bus_ids)]
}

/// The `mps v3` line: used (a control daemon that routes clients by
/// cgroup, r620, and `[mps] sm_partitions` off: offline jobs get
/// namespaces), present but not used (socket routing only, which a job can
/// leave; or static partitions asked for), absent, or broken: it should be
/// used, but a running daemon speaks v2 (`not_v3`: its GPUs).
pub fn check_mps_v3(version: Option<u32>, sm_partitions: bool, not_v3: &[u32]) -> Check {
    use muxflow::node::mps_v3::{Support, CGROUP_ROUTING_MIN_VERSION, MIN_VERSION};
    let name = "mps v3";
    match Support::of(version) {
        Support::Absent => Check::ok(
            name,
            format!(
                "absent ({}; namespaces need {MIN_VERSION}+, routing by cgroup {CGROUP_ROUTING_MIN_VERSION}+): an offline job's limits are its MPS client variables' and xCUDA's (policed), or the kernel's (dmem)",
                version.map_or("a control daemon whose -v names no version".to_string(), |v| format!("control daemon {v}, by its -v"))
            ),
        ),
        Support::SocketRouting(v) => Check::ok(
            name,
            format!("present (control daemon {v}, by its -v), not used: it routes clients by socket only, so a job could leave its namespace by its CUDA_MPS_PIPE_DIRECTORY (routing by cgroup needs {CGROUP_ROUTING_MIN_VERSION}+)"),
        ),
        Support::CgroupRouting(v) if sm_partitions => Check::ok(
            name,
            format!("present (control daemon {v}, by its -v), not used: [mps] sm_partitions is set, and static partitions run on an MPS v2 daemon"),
        ),
        Support::CgroupRouting(v) if !not_v3.is_empty() => Check::fail(
            name,
            format!("present (control daemon {v}, by its -v), but the daemon of GPU {not_v3:?} runs MPS v2: its offline jobs get no namespace (their limits stay the MPS client variables' and xCUDA's, policed)"),
            "stop that daemon while its GPU has no job (echo quit | nvidia-cuda-mps-control with its CUDA_MPS_PIPE_DIRECTORY): the next job's Prolog starts it with -p 3; if it falls back again, the Prolog's log says what the daemon refused",
        ),
        Support::CgroupRouting(v) => Check::ok(
            name,
            format!("used (control daemon {v}, by its -v): daemons start with -p 3; each offline job gets a namespace routed by its cgroup whose pinned memory limit and thread percentage the daemon holds (enforced_by_mem=driver, enforced_by_sm=driver)"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mps_device_lines_name_the_uuid_or_fail_a_daemon_of_another_gpu() {
        let (a, b) = ("GPU-aaaa", "GPU-bbbb");
        let c = check_mps_device(1, Some(a), Some(a), true);
        assert!(
            c.fix.is_none() && c.detail.contains("CUDA_VISIBLE_DEVICES=GPU-aaaa"),
            "{c:?}"
        );
        let c = check_mps_device(1, Some(b), Some(a), true);
        assert!(
            c.fix.is_some() && c.detail.contains("NVML names GPU 1 GPU-bbbb"),
            "{c:?}"
        );
        let c = check_mps_device(1, Some(a), Some("1"), true);
        assert!(
            c.fix.is_none() && c.detail.contains("clients are given 0"),
            "{c:?}"
        );
        let c = check_mps_device(1, Some(a), None, false);
        assert!(
            c.fix.is_none()
                && c.detail
                    .contains("first Prolog starts it with CUDA_VISIBLE_DEVICES=GPU-aaaa"),
            "{c:?}"
        );
        let c = check_mps_device(1, Some(a), None, true);
        assert!(
            c.fix.is_none() && c.detail.contains("did not note"),
            "{c:?}"
        );
        assert!(check_mps_device(1, None, None, false).fix.is_some());
    }

    #[test]
    fn driver_mechanisms_are_named_present_or_absent() {
        let region = DmemFound {
            regions: Some(vec![("drm/0000:18:00.0/vram0".to_string(), 1u64 << 36)]),
            jobs_parent_offers: None,
        };
        let none = DmemFound::default();
        let bus = ["0000:18:00.0".to_string(), "0000:28:00.0".to_string()];
        let line =
            |c: &[Check], name: &str| c.iter().find(|c| c.name == name).map(Check::line).unwrap();
        let new = check_mechanisms(&region, &bus);
        assert!(
            line(&new, "dmem").contains("used: "),
            "{}",
            line(&new, "dmem")
        );
        assert!(line(&new, "dmem").contains("on 1 of the node's 2 GPUs; the others"));
        let old = check_mechanisms(&none, &bus);
        assert!(line(&old, "dmem").contains("absent"));
        assert!(
            new.iter().chain(&old).all(|c| c.fix.is_none()),
            "informative only"
        );
    }

    #[test]
    fn mps_v3_lines_say_used_present_absent_or_broken() {
        // (case, version, sm_partitions, GPUs speaking v2, passes, contains)
        let cases = [
            (
                "no version",
                None,
                false,
                vec![],
                true,
                "absent (a control daemon whose -v names no version",
            ),
            (
                "13.1",
                Some(13010),
                false,
                vec![],
                true,
                "absent (control daemon 13010",
            ),
            (
                "r615: socket routing only",
                Some(13040),
                false,
                vec![],
                true,
                "present (control daemon 13040, by its -v), not used: it routes clients by socket only",
            ),
            (
                "r620, partitions asked for",
                Some(13050),
                true,
                vec![],
                true,
                "not used: [mps] sm_partitions is set",
            ),
            (
                "r620, a daemon left in v2",
                Some(13050),
                false,
                vec![0],
                false,
                "the daemon of GPU [0] runs MPS v2",
            ),
            (
                "r620",
                Some(13050),
                false,
                vec![],
                true,
                "used (control daemon 13050, by its -v)",
            ),
        ];
        for (case, version, parts, not_v3, passes, want) in cases {
            let c = check_mps_v3(version, parts, &not_v3);
            assert_eq!(c.fix.is_none(), passes, "{case}: {}", c.line());
            assert!(c.line().contains(want), "{case}: {}", c.line());
        }
    }

    #[test]
    fn sm_partition_lines_say_used_available_absent_or_broken() {
        let h100 = Some(ComputeCapability { major: 9, minor: 0 });
        let t4 = Some(ComputeCapability { major: 7, minor: 5 });
        // (case, configured, version, cc, GPUs without -S, passes, contains)
        let cases = [
            (
                "used",
                true,
                Some(13010),
                h100,
                vec![],
                true,
                "used (control daemon 13010, by its -v)",
            ),
            (
                "off",
                false,
                Some(13040),
                h100,
                vec![],
                true,
                "available (control daemon 13040, by its -v, Ampere or newer), off",
            ),
            (
                "old daemon",
                true,
                Some(12080),
                h100,
                vec![],
                true,
                "absent (control daemon 12080",
            ),
            (
                "no version",
                false,
                None,
                h100,
                vec![],
                true,
                "absent (a control daemon whose -v names no version",
            ),
            (
                "Turing",
                true,
                Some(13010),
                t4,
                vec![],
                true,
                "is set and ignored here",
            ),
            (
                "daemon without -S",
                true,
                Some(13010),
                h100,
                vec![1],
                false,
                "the daemon of GPU [1] runs without -S",
            ),
        ];
        for (case, configured, version, cc, without, passes, want) in cases {
            let c = check_sm_partitions(configured, version, cc, &without);
            assert_eq!(c.fix.is_none(), passes, "{case}: {}", c.line());
            assert!(c.line().contains(want), "{case}: {}", c.line());
        }
    }

    #[test]
    fn dmem_lines_say_absent_used_or_broken_with_the_fix() {
        let bus = ["0000:18:00.0".to_string()];
        let regions = |r: &[&str]| Some(r.iter().map(|n| (n.to_string(), 1u64 << 30)).collect());
        // (case, found, passes, line contains)
        let cases = [
            (
                "no controller",
                DmemFound::default(),
                true,
                "absent: no cgroup v2 dmem",
            ),
            (
                "no region for the GPU",
                DmemFound {
                    regions: regions(&["drm/0000:99:00.0/vram0"]),
                    jobs_parent_offers: None,
                },
                true,
                "absent for this node's GPUs",
            ),
            (
                "used",
                DmemFound {
                    regions: regions(&["drm/0000:18:00.0/vram0"]),
                    jobs_parent_offers: Some(true),
                },
                true,
                "used: an offline job's GPU memory cap goes into its cgroup's dmem.max",
            ),
            (
                "not offered to the job cgroups",
                DmemFound {
                    regions: regions(&["drm/0000:18:00.0/vram0"]),
                    jobs_parent_offers: Some(false),
                },
                false,
                "echo +dmem > cgroup.subtree_control",
            ),
        ];
        for (case, found, passes, want) in cases {
            let c = check_dmem(&found, &bus);
            assert_eq!(c.fix.is_none(), passes, "{case}: {}", c.line());
            assert!(c.line().contains(want), "{case}: {}", c.line());
        }
    }

    #[test]
    fn multiuser_lines_pass_what_works_or_was_chosen_and_fail_what_is_broken() {
        let h100 = Some(ComputeCapability { major: 9, minor: 0 });
        let p100 = Some(ComputeCapability { major: 6, minor: 0 });
        let refused = "single_user: nvidia-cuda-mps-control -d -multiuser-server failed (exit 1)";
        // (name, asked, cc, running, note, passes, detail or fix contains)
        let cases = [
            (
                "running multi-user",
                true,
                h100,
                Some(true),
                None,
                true,
                "jobs of different users share it",
            ),
            (
                "not started yet",
                true,
                h100,
                None,
                None,
                true,
                "the first Prolog starts",
            ),
            (
                "refused the flag",
                true,
                h100,
                Some(false),
                Some(refused),
                false,
                "failed (exit 1)",
            ),
            (
                "started by hand without it",
                true,
                h100,
                Some(false),
                None,
                false,
                "set [mps] multiuser = false",
            ),
            (
                "pre-Volta",
                true,
                p100,
                Some(false),
                None,
                true,
                "below 7.0",
            ),
            (
                "the admin's choice",
                false,
                h100,
                Some(false),
                None,
                true,
                "multiuser = false in muxflow.toml",
            ),
        ];
        for (name, asked, cc, running, note, passes, says) in cases {
            let c = check_multiuser(0, asked, cc, running, note);
            assert_eq!(c.fix.is_none(), passes, "{name}: {}", c.line());
            assert!(c.line().contains(says), "{name}: {}", c.line());
        }
    }

    const GOOD_GRES: &str = "Name=gpu File=/dev/nvidia[0-1]\nName=mfslot Type=g0 File=/dev/nvidia0\nName=mfslot Type=g1 File=/dev/nvidia1\n";

    /// Links as etc/gres-muxflow makes them: `<dir>/s<k>/nvidia<i>` leads
    /// to `/dev/nvidia<i>`.
    fn links(f: &str) -> String {
        match f.rsplit_once("/nvidia") {
            Some((dir, i)) if dir.contains("/s") && !dir.starts_with("/dev") => {
                format!("/dev/nvidia{i}")
            }
            _ => f.to_string(),
        }
    }

    #[test]
    fn gres_conf_slots_per_gpu_on_its_device() {
        let two = "Name=gpu File=/dev/nvidia[0-1]\nName=mfslot Type=g0 File=/dev/nvidia0\nName=mfslot Type=g0 File=/etc/slurm/muxflow-slots/s2/nvidia0\nName=mfslot Type=g1 File=/dev/nvidia1\nName=mfslot Type=g1 File=/etc/slurm/muxflow-slots/s2/nvidia1\n";
        let identical = "Name=gpu File=/dev/nvidia[0-1]\nName=mfslot Type=g0 File=/dev/nvidia0\nName=mfslot Type=g0 File=/dev/nvidia0\nName=mfslot Type=g1 File=/dev/nvidia1\nName=mfslot Type=g1 File=/dev/nvidia1\n";
        let rows = [
            ("the pattern", GOOD_GRES, 1, None),
            ("two slots per GPU: the second a link", two, 2, None),
            (
                "two slots per GPU naming one file twice (slurmd 26.05 exits)",
                identical,
                2,
                Some("/dev/nvidia0 is named by several mfslot lines"),
            ),
            (
                "a link to the other GPU",
                "Name=gpu File=/dev/nvidia[0-1]\nName=mfslot Type=g0 File=/dev/nvidia0\nName=mfslot Type=g0 File=/x/s2/nvidia1\nName=mfslot Type=g1 File=/dev/nvidia1\nName=mfslot Type=g1 File=/x/s2/nvidia0\n",
                2,
                Some("expected 2 typed g0"),
            ),
            (
                "one line where two are configured",
                GOOD_GRES,
                2,
                Some("expected 2 typed g0 ([policy] offline_per_gpu = 2)"),
            ),
            (
                "two lines where one is configured",
                two,
                1,
                Some("expected 1 typed g0"),
            ),
            (
                "a slot missing",
                "Name=gpu File=/dev/nvidia[0-1]\nName=mfslot Type=g0 File=/dev/nvidia0\n",
                1,
                Some("GPU 1 (/dev/nvidia1) has no mfslot slot"),
            ),
            (
                "slots crossed",
                "Name=gpu File=/dev/nvidia[0-1]\nName=mfslot Type=g1 File=/dev/nvidia0\nName=mfslot Type=g0 File=/dev/nvidia1\n",
                1,
                Some("expected 1 typed g0"),
            ),
            (
                "no GPUs",
                "Name=mfslot Type=g0 File=/dev/nvidia0\n",
                1,
                Some("no Name=gpu line"),
            ),
            (
                "another node's lines are not this node's",
                "NodeName=other Name=gpu File=/dev/nvidia0\nNodeName=n[1-2] Name=gpu File=/dev/nvidia0\nNodeName=n[1-2] Name=mfslot Type=g0 File=/dev/nvidia0\n",
                1,
                None,
            ),
        ];
        for (name, text, per_gpu, want) in rows {
            let c = check_gres(text, "n1", "mfslot", per_gpu, links);
            match want {
                None => assert!(c.fix.is_none(), "{name}: {}", c.line()),
                Some(w) => assert!(
                    c.fix.is_some() && c.line().contains(w),
                    "{name}: {}",
                    c.line()
                ),
            }
        }
    }

    #[test]
    fn a_slot_file_leads_through_its_links() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("nvidia0");
        std::fs::write(&dev, "").unwrap();
        std::fs::create_dir(dir.path().join("s2")).unwrap();
        let link = dir.path().join("s2/nvidia0");
        std::os::unix::fs::symlink("../nvidia0", &link).unwrap();
        let again = dir.path().join("s3");
        std::os::unix::fs::symlink(&link, &again).unwrap();
        let want = dir.path().join("s2/../nvidia0");
        assert_eq!(
            device_behind(again.to_str().unwrap()),
            want.display().to_string()
        );
        assert_eq!(
            device_behind(dev.to_str().unwrap()),
            dev.display().to_string()
        );
        assert_eq!(device_behind("/nonexistent/x"), "/nonexistent/x");
    }

    /// The shipped generator writes what the check accepts, for any count,
    /// and its links lead to the GPUs' files.
    #[test]
    fn the_gres_generator_satisfies_the_check() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../etc/gres-muxflow");
        let dir = tempfile::tempdir().unwrap();
        let slot_dir = dir.path().join("slots");
        for (count, per_gpu) in [("1", 1), ("3", 1), ("16", 1), ("2", 2), ("3", 4)] {
            let out = std::process::Command::new(&script)
                .args(["--node", "n1", "--per-gpu", &per_gpu.to_string()])
                .arg("--slot-dir")
                .arg(&slot_dir)
                .args(["--make-links", count])
                .output()
                .unwrap();
            assert!(out.status.success(), "{count}");
            let text = String::from_utf8(out.stdout).unwrap();
            let c = check_gres(&text, "n1", "mfslot", per_gpu, device_behind);
            assert!(c.fix.is_none(), "{count}: {}\n{text}", c.line());
            assert!(
                c.detail.starts_with(&format!("{count} GPUs")),
                "{}",
                c.detail
            );
        }
        let bad = std::process::Command::new(&script)
            .arg("x")
            .output()
            .unwrap();
        assert!(!bad.status.success());
    }

    #[test]
    fn wiring_accepts_drop_ins_and_names_what_is_missing() {
        let conf = conf_values(
            "Prolog=/etc/slurm/prolog.d/*\nEpilog=/usr/sbin/muxflow-epilog\nHealthCheckProgram=/usr/sbin/muxflow-health\nPrologFlags=Contain,Alloc\n",
        );
        let drop_in = vec![(
            PathBuf::from("/etc/slurm/prolog.d/50-muxflow"),
            "#!/bin/sh\nexec /usr/sbin/muxflow-prolog\n".to_string(),
        )];
        let all = check_wiring(&conf, &drop_in, &[], false);
        assert!(all.iter().all(|c| c.fix.is_none()), "{all:?}");

        let bare = conf_values("Prolog=/etc/slurm/site-prolog\nHealthCheckProgram=/usr/sbin/nhc\n");
        let lines: Vec<String> = check_wiring(&bare, &[], &[], false)
            .iter()
            .map(Check::line)
            .collect();
        assert!(lines[0].starts_with("FAIL prolog: Prolog='/etc/slurm/site-prolog' does not run muxflow-prolog; fix: set Prolog=/etc/slurm/prolog.d/*"), "{lines:?}");
        assert!(lines[1].starts_with("FAIL epilog"), "{lines:?}");
        assert!(lines[2].starts_with("FAIL health check"), "{lines:?}");
        assert!(lines[3].starts_with("FAIL prolog flags"), "{lines:?}");
        // NHC with muxflow's check is a health check.
        assert!(check_wiring(&bare, &[], &[], true)[2].fix.is_none());
    }

    #[test]
    fn plugstack_line_version_and_ownership() {
        let dir = tempfile::tempdir().unwrap();
        let so = dir.path().join("spank_muxflow.so");
        std::fs::write(&so, "").unwrap();
        let in_use = Path::new("/etc/slurm/muxflow.toml");
        let p = PathBuf::from("/etc/slurm/plugstack.conf");
        let so = so.display();
        // (case, plugstack text, passes, line contains)
        let rows = [
            (
                "the shipped line",
                format!("required {so} config=/etc/slurm/muxflow.toml\n"),
                true,
                "required",
            ),
            (
                "no config=: the plugin's default is the file in use",
                format!("required {so}\n"),
                true,
                "required",
            ),
            (
                "commented out",
                format!("# required {so}\n"),
                false,
                "no spank_muxflow.so line",
            ),
            (
                "optional",
                format!("optional {so} config=/etc/slurm/muxflow.toml\n"),
                false,
                "is optional: where the plugin fails to load, jobs run without it, offline jobs unlimited; fix: start the line with `required`",
            ),
            (
                "config= another file",
                format!("required {so} config=/srv/muxflow.toml\n"),
                false,
                "the plugin reads config=/srv/muxflow.toml, but the Prolog, Epilog and health check read /etc/slurm/muxflow.toml: jobs would be set up by one config and checked by another; fix: set config=/etc/slurm/muxflow.toml on the plugstack line",
            ),
            (
                "an unknown argument",
                format!("required {so} conf=/etc/slurm/muxflow.toml\n"),
                false,
                "unknown muxflow argument key 'conf'",
            ),
            (
                "the plugin missing",
                "required /nope/spank_muxflow.so\n".to_string(),
                false,
                "/nope/spank_muxflow.so does not exist",
            ),
        ];
        for (case, text, passes, want) in rows {
            let c = check_plugstack(&[(p.clone(), text)], in_use);
            assert_eq!(c.fix.is_none(), passes, "{case}: {}", c.line());
            assert!(c.line().contains(want), "{case}: {}", c.line());
        }
        let so = dir.path().join("spank_muxflow.so");

        assert!(check_slurm_version("22.05.8", "slurm-wlm 22.05.8\n")
            .fix
            .is_none());
        let other = check_slurm_version("22.05.8", "slurm 24.11.5\n");
        assert!(
            other
                .line()
                .contains("built for Slurm 22.05.8, slurmd is 24.11.5"),
            "{}",
            other.line()
        );
        assert!(other
            .line()
            .contains("fix: install the muxflow packages built for Slurm 24.11"));

        let root = |mode| Ok(Owned { uid: 0, mode });
        let ok = check_root_owned(
            "xcuda",
            &so,
            &[
                (so.clone(), root(0o100755)),
                (PathBuf::from("/"), root(0o40755)),
            ],
        );
        assert!(ok.fix.is_none());
        let writable = check_root_owned("xcuda", &so, &[(so.clone(), root(0o100775))]);
        assert!(
            writable
                .line()
                .contains("writable by others (mode 0775); fix: chmod go-w"),
            "{}",
            writable.line()
        );
        let users = check_root_owned(
            "xcuda",
            &so,
            &[
                (so.clone(), root(0o100755)),
                (
                    PathBuf::from("/home/u"),
                    Ok(Owned {
                        uid: 1000,
                        mode: 0o40755,
                    }),
                ),
            ],
        );
        assert!(
            users.line().contains("/home/u is owned by uid 1000"),
            "{}",
            users.line()
        );
    }

    #[test]
    fn job_submit_plugins_must_load_lua() {
        // (case, slurm.conf, passes)
        let rows = [
            ("lua", "JobSubmitPlugins=lua\n", true),
            (
                "lua among others",
                "JobSubmitPlugins=all_partitions, job_submit/lua\n",
                true,
            ),
            ("commented out", "#JobSubmitPlugins=lua\n", false),
            ("missing", "ClusterName=c\n", false),
            ("another plugin", "JobSubmitPlugins=pbs\n", false),
        ];
        for (case, text, passes) in rows {
            let c = check_job_submit_plugins(&conf_values(text));
            assert_eq!(c.fix.is_none(), passes, "{case}: {}", c.line());
            if !passes {
                assert!(
                    c.line().contains("lacks lua")
                        && c.line().contains("fix: add lua to JobSubmitPlugins"),
                    "{case}: {}",
                    c.line()
                );
            }
        }
    }

    #[test]
    fn gres_types_must_name_gpu_and_the_slot() {
        // (case, slurm.conf, passes, line contains)
        let rows = [
            (
                "both",
                "GresTypes=gpu,mfslot\n",
                true,
                "GresTypes=gpu,mfslot",
            ),
            (
                "with others",
                "GresTypes=gpu, shard ,mfslot\n",
                true,
                "shard",
            ),
            ("no mfslot", "GresTypes=gpu\n", false, "lacks mfslot"),
            (
                "commented out",
                "# GresTypes=gpu,mfslot\n",
                false,
                "lacks gpu and mfslot",
            ),
        ];
        for (case, text, passes, want) in rows {
            let c = check_gres_types(&conf_values(text), "mfslot");
            assert_eq!(c.fix.is_none(), passes, "{case}: {}", c.line());
            assert!(c.line().contains(want), "{case}: {}", c.line());
            if !passes {
                assert!(
                    c.line().contains("fix: set GresTypes=gpu,mfslot"),
                    "{}",
                    c.line()
                );
            }
        }
    }

    #[test]
    fn a_host_slurm_conf_does_not_name_is_not_a_node() {
        let conf = "NodeName=DEFAULT Gres=gpu:1,mfslot:g0:1\nNodeName=gpu[01-04] CPUs=8\nnodename=big Gres=gpu:8 # comment\n#NodeName=vm Gres=gpu:1\n";
        assert_eq!(
            node_gres(conf, "gpu03").as_deref(),
            Some("gpu:1,mfslot:g0:1")
        );
        assert_eq!(node_gres(conf, "big").as_deref(), Some("gpu:8"));
        assert_eq!(node_gres(conf, "vm"), None);
        let c = check_node_defined("vm", Path::new("/etc/slurm/slurm.conf"), false);
        assert_eq!(
            c.line(),
            "FAIL node: no NodeName=vm in /etc/slurm/slurm.conf (nor its Includes): this host is not a Slurm node by that name; fix: pass --node NAME (this node's NodeName in slurm.conf); on the controller host, run muxflow-doctor --controller"
        );
        assert!(check_node_defined("gpu03", Path::new("/x"), true)
            .fix
            .is_none());
    }

    #[test]
    fn node_lines_in_an_include_count() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("nodes.conf"), "NodeName=n1 Gres=gpu:2\n").unwrap();
        std::fs::write(
            dir.path().join("slurm.conf"),
            "ClusterName=c\nInclude nodes.conf\nGresTypes=gpu,mfslot\n",
        )
        .unwrap();
        let text = slurm_conf_text(&dir.path().join("slurm.conf"));
        assert_eq!(node_gres(&text, "n1").as_deref(), Some("gpu:2"));
        assert_eq!(
            conf_values(&text).get("grestypes").map(String::as_str),
            Some("gpu,mfslot")
        );
    }

    #[test]
    fn slurm_conf_gres_must_match_gres_conf() {
        let two_per_gpu = "Name=gpu File=/dev/nvidia[0-1]\nName=mfslot Type=g0 File=/dev/nvidia0\nName=mfslot Type=g0 File=/s2/nvidia0\nName=mfslot Type=g1 File=/dev/nvidia1\nName=mfslot Type=g1 File=/s2/nvidia1\n";
        // (case, slurm.conf Gres=, gres.conf, passes, line contains)
        let rows = [
            ("the pattern", "gpu:2,mfslot:g0:1,mfslot:g1:1", GOOD_GRES, true, "matches gres.conf"),
            ("typed GPUs and sockets", "gpu:a100:2(S:0-1),mfslot:g0:1,mfslot:g1:1", GOOD_GRES, true, "matches"),
            ("two slots per GPU", "gpu:2,mfslot:g0:2,mfslot:g1:2", two_per_gpu, true, "matches"),
            (
                "a GPU fewer in slurm.conf",
                "gpu:1,mfslot:g0:1",
                GOOD_GRES,
                false,
                "has Gres='gpu:1,mfslot:g0:1' (gpu:1,mfslot:g0:1) but gres.conf lists gpu:2,mfslot:g0:1,mfslot:g1:1",
            ),
            (
                "no slots in slurm.conf",
                "gpu:2",
                GOOD_GRES,
                false,
                "fix: set Gres=gpu:2,mfslot:g0:1,mfslot:g1:1 on NodeName=n1",
            ),
            (
                "one slot per GPU where gres.conf has two",
                "gpu:2,mfslot:g0:1,mfslot:g1:1",
                two_per_gpu,
                false,
                "gres.conf lists gpu:2,mfslot:g0:2,mfslot:g1:2",
            ),
            (
                "another node's lines are not this node's",
                "gpu:1,mfslot:g0:1",
                "NodeName=n1 Name=gpu File=/dev/nvidia0\nNodeName=n1 Name=mfslot Type=g0 File=/dev/nvidia0\nNodeName=n2 Name=gpu File=/dev/nvidia1\n",
                true,
                "matches",
            ),
            ("Count= instead of files", "gpu:4", "Name=gpu Count=4\n", true, "matches"),
        ];
        for (case, gres, conf, passes, want) in rows {
            let c = check_gres_agreement("n1", gres, conf, "mfslot");
            assert_eq!(c.fix.is_none(), passes, "{case}: {}", c.line());
            assert!(c.line().contains(want), "{case}: {}", c.line());
        }
    }
}
