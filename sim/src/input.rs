//! The replay's inputs, read from CSV with header-named columns (unknown
//! columns are ignored): the node list, the task mix, the offline run
//! times and the measured pair throughputs. Every bad row stops the run
//! with `file:line`, the column and what was expected; nothing here panics
//! on input.

use std::collections::BTreeMap;

/// Where a CSV came from, for error messages (`--nodes F`, or the shipped
/// default's name).
#[derive(Debug, Clone)]
pub struct Source<'a> {
    pub name: String,
    pub bytes: &'a [u8],
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum InputError {
    #[error("{file}: missing {} {}; the header must name {required}", if missing.len() == 1 { "column" } else { "columns" }, missing_words(missing))]
    MissingColumns {
        file: String,
        /// Each missing column with what the replay reads from it.
        missing: Vec<(String, String)>,
        required: String,
    },
    #[error("{file}:{line}: column '{column}': '{value}' is not {expected}")]
    BadValue {
        file: String,
        line: u64,
        column: String,
        value: String,
        expected: String,
    },
    #[error("{file}:{line}: {why}")]
    BadRow {
        file: String,
        line: u64,
        why: String,
    },
    #[error("{file}: {why}")]
    Content { file: String, why: String },
}

fn missing_words(missing: &[(String, String)]) -> String {
    missing
        .iter()
        .map(|(c, why)| format!("'{c}' ({why})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A required column and what the replay reads from it (named when missing).
type Column<'a> = (&'a str, &'a str);

/// A CSV table: the header's column positions and the rows, with their line
/// numbers.
struct Table {
    file: String,
    columns: BTreeMap<String, usize>,
    rows: Vec<(u64, csv::StringRecord)>,
}

impl Table {
    /// Reads `src`; every required column the header lacks is named in one
    /// error, with what it is for.
    fn read(src: &Source, required: &[Column]) -> Result<Table, InputError> {
        let file = src.name.clone();
        let mut rdr = csv::ReaderBuilder::new()
            .trim(csv::Trim::All)
            .flexible(false)
            .from_reader(src.bytes);
        let header = rdr.headers().map_err(|e| csv_error(&file, e))?.clone();
        let columns: BTreeMap<String, usize> = header
            .iter()
            .enumerate()
            .map(|(i, h)| (h.trim_start_matches('\u{feff}').to_string(), i))
            .collect();
        let missing: Vec<(String, String)> = required
            .iter()
            .filter(|(c, _)| !columns.contains_key(*c))
            .map(|(c, why)| (c.to_string(), why.to_string()))
            .collect();
        if !missing.is_empty() {
            return Err(InputError::MissingColumns {
                file,
                missing,
                required: required
                    .iter()
                    .map(|(c, _)| *c)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let mut rows = Vec::new();
        for rec in rdr.records() {
            let rec = rec.map_err(|e| csv_error(&file, e))?;
            let line = rec.position().map_or(0, |p| p.line());
            rows.push((line, rec));
        }
        Ok(Table {
            file,
            columns,
            rows,
        })
    }

    fn get<'r>(&self, row: &'r csv::StringRecord, column: &str) -> &'r str {
        row.get(self.columns[column]).unwrap_or("")
    }

    /// Parses a column with `FromStr`, naming what was expected on failure.
    fn parse<T: std::str::FromStr>(
        &self,
        line: u64,
        row: &csv::StringRecord,
        column: &str,
        expected: &str,
        ok: impl Fn(&T) -> bool,
    ) -> Result<T, InputError> {
        let value = self.get(row, column);
        match value.parse::<T>() {
            Ok(v) if ok(&v) => Ok(v),
            _ => Err(InputError::BadValue {
                file: self.file.clone(),
                line,
                column: column.to_string(),
                value: value.to_string(),
                expected: expected.to_string(),
            }),
        }
    }
}

fn csv_error(file: &str, e: csv::Error) -> InputError {
    let line = e.position().map_or(0, |p| p.line());
    let why = match e.kind() {
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => format!("{len} fields where the header has {expected_len}"),
        csv::ErrorKind::Utf8 { .. } => "not UTF-8 text".to_string(),
        _ => e.to_string(),
    };
    InputError::BadRow {
        file: file.to_string(),
        line,
        why,
    }
}

/// The node list's optional memory column.
pub const MEM_COLUMN: &str = "gpu_mem_mib";

/// One node of the node list.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub name: String,
    pub gpus: u32,
    /// GPU model, as `gpu_spec` names it.
    pub model: String,
    /// Memory of each GPU, MiB: the optional `gpu_mem_mib` column, else the
    /// model's ([`gpu_memory_mib`]).
    pub mem_mib: u64,
}

/// GPU memory by model name, MiB, for node lists without a `gpu_mem_mib`
/// column: the boards' nominal memory (NVIDIA's data sheets; the H200 as
/// `nvidia-smi` showed it on the lent H200, real-gpu/README.md), under the
/// names a Slurm site or the OpenB trace gives them. `G2` and `G3` are the
/// OpenB trace's anonymized models: their memory is not published, and the
/// shipped replay takes them as 16 GiB (sim/README.md). None: unknown —
/// the node list must say (never guessed).
pub fn gpu_memory_mib(model: &str) -> Option<u64> {
    const GIB: u64 = 1024;
    let m = model.to_ascii_uppercase().replace(['_', ' '], "-");
    Some(match m.as_str() {
        "P100" | "V100" | "V100M16" | "V100-16GB" | "G2" | "G3" => 16 * GIB,
        "V100M32" | "V100-32GB" => 32 * GIB,
        "T4" => 15 * GIB,
        "A10" | "A10G" | "A30" | "L4" => 24 * GIB,
        "A40" | "L40" | "L40S" | "RTX-A6000" => 48 * GIB,
        "A100-40GB" | "A100-PCIE-40GB" | "A100-SXM4-40GB" => 40 * GIB,
        "A100" | "A100-80GB" | "A100-SXM4-80GB" | "A800" | "H100" | "H100-80GB" | "H100-SXM"
        | "H100-PCIE" | "H800" => 80 * GIB,
        "H100-NVL" => 94 * GIB,
        "H20" | "GH200" => 96 * GIB,
        "H200" | "H200-141GB" => 143_771,
        _ => return None,
    })
}

/// `sn,gpu,model` (the format of `openb_node_list_gpu_node.csv`), and an
/// optional `gpu_mem_mib` (memory per GPU) that any model needs whose
/// memory [`gpu_memory_mib`] does not know. Nodes without GPUs are kept out.
pub fn read_nodes(src: &Source) -> Result<Vec<Node>, InputError> {
    let t = Table::read(
        src,
        &[
            ("sn", "the node's name"),
            ("gpu", "its GPU count"),
            ("model", "its GPU model, matched against a task's gpu_spec"),
        ],
    )?;
    let mut out = Vec::with_capacity(t.rows.len());
    for (line, row) in &t.rows {
        let gpus: u32 = t.parse(*line, row, "gpu", "a GPU count (0 to 64)", |n| *n <= 64)?;
        let name = t.get(row, "sn");
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(InputError::BadValue {
                file: t.file.clone(),
                line: *line,
                column: "sn".into(),
                value: name.into(),
                expected: "a node name without spaces".into(),
            });
        }
        if gpus == 0 {
            continue;
        }
        let model = t.get(row, "model").to_string();
        let given = t.columns.contains_key(MEM_COLUMN) && !t.get(row, MEM_COLUMN).is_empty();
        let mem_mib = match given {
            true => t.parse(
                *line,
                row,
                MEM_COLUMN,
                "MiB of memory per GPU (1024 to 1048576)",
                |m: &u64| (1024..=1 << 20).contains(m),
            )?,
            false => gpu_memory_mib(&model).ok_or_else(|| InputError::BadValue {
                file: t.file.clone(),
                line: *line,
                column: "model".into(),
                value: model.clone(),
                expected: format!(
                    "a GPU model whose memory is known, or the node list's {MEM_COLUMN} column \
                     (MiB per GPU) for it: the replay never guesses a board's memory"
                ),
            })?,
        };
        out.push(Node {
            name: name.to_string(),
            gpus,
            model,
            mem_mib,
        });
    }
    if out.is_empty() {
        return Err(InputError::Content {
            file: t.file,
            why: "no node with a GPU".into(),
        });
    }
    Ok(out)
}

/// Online (latency-sensitive) or offline (best-effort) work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Online,
    Offline,
}

/// One task of the task mix.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub name: String,
    pub kind: Kind,
    pub num_gpu: u32,
    /// Share of each GPU, thousandths (1000 = a whole GPU).
    pub gpu_milli: u32,
    /// GPU models it may run on; `None`: any.
    pub gpu_spec: Option<Vec<String>>,
}

/// `name,num_gpu,gpu_milli,gpu_spec,qos` (the format of
/// `openb_pod_list_*.csv`): qos LS, Guaranteed, Burstable = online; BE =
/// offline. `gpu_spec` lists models separated by `|` (empty: any).
pub fn read_tasks(src: &Source) -> Result<Vec<Task>, InputError> {
    let t = Table::read(
        src,
        &[
            ("name", "the task's name"),
            ("num_gpu", "GPUs per task"),
            ("gpu_milli", "thousandths of each GPU it uses"),
            (
                "gpu_spec",
                "the GPU models it may run on, '|'-separated; an empty cell: any",
            ),
            (
                "qos",
                "online or offline: LS, Guaranteed, Burstable are online, BE offline",
            ),
        ],
    )?;
    let mut out = Vec::with_capacity(t.rows.len());
    for (line, row) in &t.rows {
        let num_gpu: u32 = t.parse(*line, row, "num_gpu", "a GPU count (0 to 64)", |n| *n <= 64)?;
        let gpu_milli: u32 = t.parse(
            *line,
            row,
            "gpu_milli",
            "thousandths of a GPU (0 to 1000)",
            |m| *m <= 1000,
        )?;
        let qos = t.get(row, "qos");
        let kind = match qos {
            "LS" | "Guaranteed" | "Burstable" => Kind::Online,
            "BE" => Kind::Offline,
            _ => {
                return Err(InputError::BadValue {
                    file: t.file.clone(),
                    line: *line,
                    column: "qos".into(),
                    value: qos.into(),
                    expected: "LS, Guaranteed, Burstable (online) or BE (offline)".into(),
                })
            }
        };
        let spec = t.get(row, "gpu_spec");
        let gpu_spec = (!spec.is_empty()).then(|| {
            spec.split('|')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        });
        out.push(Task {
            name: t.get(row, "name").to_string(),
            kind,
            num_gpu,
            gpu_milli,
            gpu_spec,
        });
    }
    let uses_gpu = |k: Kind| {
        out.iter()
            .any(|t| t.kind == k && t.num_gpu > 0 && t.gpu_milli > 0)
    };
    for (kind, what) in [
        (Kind::Online, "online (qos LS, Guaranteed or Burstable)"),
        (Kind::Offline, "offline (qos BE)"),
    ] {
        if !uses_gpu(kind) {
            return Err(InputError::Content {
                file: t.file.clone(),
                why: format!(
                    "no {what} task with a GPU (num_gpu > 0, gpu_milli > 0): the replay needs both kinds"
                ),
            });
        }
    }
    Ok(out)
}

/// Offline run times alone on a whole GPU, seconds (`runtime`).
pub fn read_runtimes(src: &Source) -> Result<Vec<f64>, InputError> {
    let t = Table::read(src, &[("runtime", "seconds alone on a whole GPU")])?;
    let mut out = Vec::with_capacity(t.rows.len());
    for (line, row) in &t.rows {
        out.push(t.parse(
            *line,
            row,
            "runtime",
            "a run time in seconds (a finite number >= 0)",
            |v: &f64| v.is_finite() && *v >= 0.0,
        )?);
    }
    if out.is_empty() {
        return Err(InputError::Content {
            file: t.file,
            why: "no run time".into(),
        });
    }
    Ok(out)
}

/// Measured pair throughputs: `speed(a, b)` is the normalized throughput
/// (shared / solo) of a job of type `a` next to one of type `b`; `None`
/// when the pair cannot co-locate (0/0 in the file, or never measured in
/// either order).
#[derive(Debug, Clone, PartialEq)]
pub struct Pairs {
    /// Job types, sorted (the hash mapping indexes this list).
    pub types: Vec<String>,
    speed: Vec<Option<f64>>,
    /// A type's solo throughput in its own units (steps/s or samples/s).
    pub solo: Vec<f64>,
}

impl Pairs {
    pub fn speed(&self, a: u16, b: u16) -> Option<f64> {
        self.speed[a as usize * self.types.len() + b as usize]
    }

    /// What a job of type `a` keeps next to a partner it does not know yet:
    /// its mean throughput over the types it can share with (1 if none).
    pub fn mean_speed(&self, a: u16) -> f64 {
        let n = self.types.len();
        let (sum, count) = (0..n as u16)
            .filter_map(|b| self.speed(a, b))
            .fold((0.0, 0u32), |(s, c), v| (s + v, c + 1));
        if count == 0 {
            1.0
        } else {
            sum / f64::from(count)
        }
    }

    /// Both sides: (a next to b, b next to a); `None` if they cannot share.
    pub fn pair(&self, a: u16, b: u16) -> Option<(f64, f64)> {
        Some((self.speed(a, b)?, self.speed(b, a)?))
    }

    /// A task's job type: FNV-1a (64-bit) of its name, modulo the number
    /// of types (sorted by name). Stable across runs and platforms.
    pub fn job_type(&self, name: &str) -> u16 {
        (fnv1a(name.as_bytes()) % self.types.len() as u64) as u16
    }
}

pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `job_a,job_b,solo_a,solo_b,shared_a,shared_b` (the format of
/// `gavel_v100_pairs.csv`).
pub fn read_pairs(src: &Source) -> Result<Pairs, InputError> {
    let t = Table::read(
        src,
        &[
            ("job_a", "the first job type's name"),
            ("job_b", "the second job type's name"),
            ("solo_a", "job_a's throughput alone"),
            ("solo_b", "job_b's throughput alone"),
            ("shared_a", "job_a's throughput beside job_b"),
            ("shared_b", "job_b's throughput beside job_a"),
        ],
    )?;
    let mut rows = Vec::with_capacity(t.rows.len());
    let mut types = std::collections::BTreeSet::new();
    for (line, row) in &t.rows {
        let num = |c: &str, what: &str, ok: fn(&f64) -> bool| t.parse(*line, row, c, what, ok);
        let solo_a = num("solo_a", "a throughput > 0", |v| v.is_finite() && *v > 0.0)?;
        let solo_b = num("solo_b", "a throughput > 0", |v| v.is_finite() && *v > 0.0)?;
        let shared_a = num("shared_a", "a throughput >= 0", |v| {
            v.is_finite() && *v >= 0.0
        })?;
        let shared_b = num("shared_b", "a throughput >= 0", |v| {
            v.is_finite() && *v >= 0.0
        })?;
        let (a, b) = (t.get(row, "job_a"), t.get(row, "job_b"));
        for (c, v) in [("job_a", a), ("job_b", b)] {
            if v.is_empty() {
                return Err(InputError::BadValue {
                    file: t.file.clone(),
                    line: *line,
                    column: c.into(),
                    value: v.into(),
                    expected: "a job type name".into(),
                });
            }
        }
        if (shared_a == 0.0) != (shared_b == 0.0) {
            return Err(InputError::BadRow {
                file: t.file.clone(),
                line: *line,
                why: "shared_a and shared_b: one is 0 and the other not (0/0 means cannot co-locate; otherwise both must be > 0)".into(),
            });
        }
        types.insert(a.to_string());
        types.insert(b.to_string());
        rows.push((
            a.to_string(),
            b.to_string(),
            solo_a,
            solo_b,
            shared_a,
            shared_b,
        ));
    }
    if types.is_empty() {
        return Err(InputError::Content {
            file: t.file,
            why: "no pair".into(),
        });
    }
    let types: Vec<String> = types.into_iter().collect();
    let n = types.len();
    let idx = |s: &str| {
        types
            .binary_search_by(|t| t.as_str().cmp(s))
            .expect("collected above")
    };
    let mut speed = vec![None; n * n];
    let mut measured = vec![false; n * n];
    let mut solo = vec![0.0; n];
    for (a, b, solo_a, solo_b, shared_a, shared_b) in rows {
        let (ia, ib) = (idx(&a), idx(&b));
        if solo[ia] == 0.0 {
            solo[ia] = solo_a;
        }
        if solo[ib] == 0.0 {
            solo[ib] = solo_b;
        }
        let fits = shared_a > 0.0;
        // A row gives both orders; a row of the other order, if any,
        // overrides the mirror (it is the direct measurement).
        for (i, j, v, direct) in [
            (ia, ib, shared_a / solo_a, true),
            (ib, ia, shared_b / solo_b, false),
        ] {
            let k = i * n + j;
            if direct || !measured[k] {
                speed[k] = fits.then_some(v);
                measured[k] = measured[k] || direct;
            }
        }
    }
    Ok(Pairs { types, speed, solo })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(text: &str) -> Source<'_> {
        Source {
            name: "t.csv".into(),
            bytes: text.as_bytes(),
        }
    }

    #[test]
    fn gpu_memory_comes_from_the_column_else_the_model_and_is_never_guessed() {
        let nodes = read_nodes(&src("sn,gpu,model,gpu_mem_mib\n\
             a,8,H200,\n\
             b,8,h100_nvl,\n\
             c,4,MI300X,196608\n\
             d,2,T4,16000\n"))
        .unwrap();
        let mem: Vec<u64> = nodes.iter().map(|n| n.mem_mib).collect();
        assert_eq!(mem, [143_771, 94 * 1024, 196_608, 16_000]);
        // The shipped node list's models are all known.
        let shipped = read_nodes(&Source {
            name: "openb".into(),
            bytes: include_bytes!("../data/openb_node_list_gpu_node.csv"),
        })
        .unwrap();
        assert!(shipped.iter().all(|n| n.mem_mib >= 15 * 1024));
        assert_eq!(gpu_memory_mib("B9000"), None);
    }

    #[test]
    fn bad_rows_name_file_line_column_and_what_was_expected() {
        struct Case {
            what: &'static str,
            text: &'static str,
            read: fn(&Source) -> Result<(), InputError>,
            want: &'static str,
        }
        let nodes = |s: &Source| read_nodes(s).map(|_| ());
        let tasks = |s: &Source| read_tasks(s).map(|_| ());
        let pairs = |s: &Source| read_pairs(s).map(|_| ());
        let runtimes = |s: &Source| read_runtimes(s).map(|_| ());
        let cases = [
            Case {
                what: "GPU count not a number",
                text: "sn,gpu,model\nn1,2,V100\nn2,two,V100\n",
                read: nodes,
                want: "t.csv:3: column 'gpu': 'two' is not a GPU count (0 to 64)",
            },
            Case {
                what: "a GPU model whose memory is not known, and no memory column",
                text: "sn,gpu,model\nn1,2,V100\nn2,8,MI300X\n",
                read: nodes,
                want: "t.csv:3: column 'model': 'MI300X' is not a GPU model whose memory is known, or the node list's gpu_mem_mib column",
            },
            Case {
                what: "a memory column with a value that is no memory",
                text: "sn,gpu,model,gpu_mem_mib\nn1,2,X1,lots\n",
                read: nodes,
                want: "t.csv:2: column 'gpu_mem_mib': 'lots' is not MiB of memory per GPU",
            },
            Case {
                what: "missing column",
                text: "sn,model\nn1,V100\n",
                read: nodes,
                want: "t.csv: missing column 'gpu' (its GPU count); the header must name sn, gpu, model",
            },
            Case {
                what: "several missing columns, named at once with their use",
                text: "name,num_gpu,gpu_milli\na,1,1000\n",
                read: tasks,
                want: "t.csv: missing columns 'gpu_spec' (the GPU models it may run on, '|'-separated; an empty cell: any), 'qos' (online or offline: LS, Guaranteed, Burstable are online, BE offline); the header must name name, num_gpu, gpu_milli, gpu_spec, qos",
            },
            Case {
                what: "short row",
                text: "sn,gpu,model\nn1,2\n",
                read: nodes,
                want: "t.csv:2: 2 fields where the header has 3",
            },
            Case {
                what: "unknown qos",
                text: "name,num_gpu,gpu_milli,gpu_spec,qos\na,1,1000,,LS\nb,1,500,,XX\n",
                read: tasks,
                want: "t.csv:3: column 'qos': 'XX' is not LS, Guaranteed, Burstable (online) or BE (offline)",
            },
            Case {
                what: "share above a GPU",
                text: "name,num_gpu,gpu_milli,gpu_spec,qos\na,1,1500,,LS\n",
                read: tasks,
                want: "t.csv:2: column 'gpu_milli': '1500' is not thousandths of a GPU (0 to 1000)",
            },
            Case {
                what: "no offline task",
                text: "name,num_gpu,gpu_milli,gpu_spec,qos\na,1,1000,,LS\nb,0,0,,BE\n",
                read: tasks,
                want: "t.csv: no offline (qos BE) task with a GPU",
            },
            Case {
                what: "no online task",
                text: "name,num_gpu,gpu_milli,gpu_spec,qos\nb,1,200,,BE\n",
                read: tasks,
                want: "t.csv: no online (qos LS, Guaranteed or Burstable) task with a GPU",
            },
            Case {
                what: "negative run time",
                text: "runtime\n5\n-1\n",
                read: runtimes,
                want: "t.csv:3: column 'runtime': '-1' is not a run time in seconds",
            },
            Case {
                what: "half a 0/0",
                text: "job_a,job_b,solo_a,solo_b,shared_a,shared_b\nA,B,1,1,0,0.5\n",
                read: pairs,
                want: "t.csv:2: shared_a and shared_b: one is 0 and the other not",
            },
            Case {
                what: "solo zero",
                text: "job_a,job_b,solo_a,solo_b,shared_a,shared_b\nA,B,0,1,0.5,0.5\n",
                read: pairs,
                want: "t.csv:2: column 'solo_a': '0' is not a throughput > 0",
            },
        ];
        for c in cases {
            let e = (c.read)(&src(c.text)).expect_err(c.what).to_string();
            assert!(e.starts_with(c.want), "{}: {e}", c.what);
        }
    }

    #[test]
    fn pairs_read_both_orders_and_zero_means_cannot_share() {
        let p = read_pairs(&src("job_a,job_b,solo_a,solo_b,shared_a,shared_b,extra\n\
             B,A,10,4,5,3,x\nA,A,4,4,2,2,x\nB,B,10,10,0,0,x\n"))
        .unwrap();
        assert_eq!(p.types, ["A", "B"]);
        assert_eq!(p.pair(1, 0), Some((0.5, 0.75)));
        assert_eq!(p.pair(0, 1), Some((0.75, 0.5)));
        assert_eq!(p.pair(0, 0), Some((0.5, 0.5)));
        assert_eq!(p.pair(1, 1), None);
        assert_eq!(p.solo, [4.0, 10.0]);
        // FNV-1a of "" is the offset basis; stable across platforms.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
