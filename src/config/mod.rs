//! `muxflow.toml`: one file for every muxflow component.
//!
//! Every key has a default, unknown keys are errors, and every error names the
//! file, the line and the key, so an admin can fix it without reading code.
//! `etc/muxflow.toml` is the documented sample; a test keeps it in step with
//! the defaults here.

pub mod plugstack;
pub mod slurm_conf;

use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};

/// Where the config lives unless plugstack's `config=` says otherwise.
pub const DEFAULT_PATH: &str = "/etc/slurm/muxflow.toml";
/// The config's file name where programs look for it (see [`Config::find`]).
pub const FILE_NAME: &str = "muxflow.toml";

/// How the reader of a config names the setting that chose its path, for
/// the fix an error gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathSetting {
    /// The plugin's plugstack argument `config=PATH`.
    Plugstack,
    /// A program's `--config PATH` flag.
    Flag,
}

impl fmt::Display for PathSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathSetting::Plugstack => write!(
                f,
                "set the path with the plugstack argument config=PATH; default {DEFAULT_PATH}"
            ),
            PathSetting::Flag => write!(f, "give the path with --config PATH"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read muxflow config {path}: {source} ({set_with})")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
        set_with: PathSetting,
    },
    #[error("no muxflow config found: tried {}; put {FILE_NAME} in one of these places or give its path with --config PATH", show_paths(tried))]
    NotFound { tried: Vec<PathBuf> },
    #[error("node name '{0}' cannot be used in a path")]
    BadNode(String),
    #[error("{path}:{line}:{column}: key '{key}': {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        column: usize,
        key: String,
        message: String,
    },
}

/// A whole-number percentage, 0 to 100.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Percent(u8);

impl Percent {
    pub const fn new(v: u8) -> Option<Self> {
        if v <= 100 {
            Some(Percent(v))
        } else {
            None
        }
    }
    pub const fn get(self) -> u8 {
        self.0
    }
}

impl<'de> Deserialize<'de> for Percent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = i64::deserialize(d)?;
        u8::try_from(v).ok().and_then(Percent::new).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{v} is not a percentage: use a whole number from 0 to 100"
            ))
        })
    }
}

impl fmt::Display for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%", self.0)
    }
}

/// A fraction from 0.0 to 1.0 (e.g. of the maximum SM clock).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Fraction(f64);

impl Fraction {
    pub fn new(v: f64) -> Option<Self> {
        (0.0..=1.0).contains(&v).then_some(Fraction(v))
    }
    pub const fn get(self) -> f64 {
        self.0
    }
}

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        Fraction::new(v).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{v} is not a fraction: use a number from 0.0 to 1.0"
            ))
        })
    }
}

/// An absolute path (root acts on these; a relative path would depend on the
/// working directory of whichever daemon reads the file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbsPath(PathBuf);

impl AbsPath {
    pub fn new(p: impl Into<PathBuf>) -> Option<Self> {
        let p = p.into();
        p.is_absolute().then_some(AbsPath(p))
    }
    pub fn as_path(&self) -> &Path {
        &self.0
    }
}

impl<'de> Deserialize<'de> for AbsPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        AbsPath::new(&s).ok_or_else(|| {
            serde::de::Error::custom(format!("'{s}' is not an absolute path: start it with '/'"))
        })
    }
}

impl AsRef<Path> for AbsPath {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

fn abs(p: &str) -> AbsPath {
    AbsPath(PathBuf::from(p))
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub paths: Paths,
    pub slurm: Slurm,
    pub policy: Policy,
    pub xcuda: Xcuda,
    pub health: Health,
    pub matcher: Matcher,
    pub mps: Mps,
    pub metrics: Metrics,
}

/// Where muxflow's figures go for Prometheus and DCGM (all off by default).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Metrics {
    /// node_exporter's textfile-collector directory: the node programs write
    /// `muxflow.prom` there (atomically) at every health step, Prolog and
    /// Epilog, and the matcher `muxflow-matcher.prom` after every round.
    /// `{node}` expands. Unset: no textfile.
    pub textfile_dir: Option<AbsPath>,
    /// dcgm-exporter's `--hpc-job-mapping-dir`: one file per GPU index
    /// listing every job on the GPU (online and offline), so DCGM's metrics
    /// get job labels on shared GPUs. `{node}` expands. Unset: none.
    pub dcgm_job_mapping_dir: Option<AbsPath>,
    /// The matcher's HTTP endpoint for Prometheus (`/metrics`): a port
    /// (`"9842"`) listens on loopback only (127.0.0.1); another interface
    /// is the site's choice, written as an address and port
    /// (`"10.0.0.5:9842"`, `"[::]:9842"`). Unset: no endpoint. Read with
    /// [`Metrics::listen_addr`].
    pub listen: Option<String>,
}

impl Metrics {
    /// `listen` as the address to bind; `None` when unset (a value that is
    /// no address was refused when the config was loaded).
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.listen.as_deref().and_then(parse_listen)
    }
}

/// A `[metrics] listen` value: `PORT` or `:PORT` is loopback
/// (`127.0.0.1:PORT`), `ADDRESS:PORT` is taken as written. No host names
/// (a name could resolve to any interface) and no port 0 (a port chosen
/// at random that no scraper could be told).
fn parse_listen(text: &str) -> Option<SocketAddr> {
    let port_only = text.strip_prefix(':').unwrap_or(text);
    let addr = match port_only.parse::<u16>() {
        Ok(port) => SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)),
        Err(_) => text.parse().ok()?,
    };
    (addr.port() != 0).then_some(addr)
}

/// The MPS control daemons (one per GPU).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Mps {
    /// Start each daemon in NVIDIA's multi-user server mode
    /// (`-multiuser-server`, Volta and newer, not Tegra): clients of every
    /// user share one server. Without it MPS serves one user at a time and
    /// a second user's client waits for the first's to leave, so muxflow
    /// then pairs only jobs of one user on a GPU (see `crate::node::mps`).
    pub multiuser: bool,
    /// Removed: muxflow passes NVIDIA's documented flag itself. Kept only
    /// to name the fix when an old config still sets it.
    multiuser_flag: Option<toml::Value>,
    /// Opt-in: start each daemon in NVIDIA's static SM partitioning mode
    /// (`-S`; control daemon 13010+ and Ampere or newer, else ignored) and
    /// give each job a partition of the GPU's SMs, sized from the policy's
    /// share (`crate::node::sm_partition`): the driver then holds an offline job
    /// to its SMs even without xCUDA.
    pub sm_partitions: bool,
    /// Longest wait for one MPS control command.
    pub command_timeout_ms: u64,
}

impl Default for Mps {
    fn default() -> Self {
        Mps {
            multiuser: true,
            multiuser_flag: None,
            sm_partitions: false,
            command_timeout_ms: 5000,
        }
    }
}

/// Files and directories. All root-owned, admin-chosen; never under /tmp.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Paths {
    /// Per-GPU health state and metric history. `{node}` in this and the two
    /// MPS roots is replaced by the node name (several slurmd on one host).
    pub state_dir: AbsPath,
    /// Parent of the per-GPU MPS pipe directories (`<root>/<gpu>`).
    pub mps_pipe_root: AbsPath,
    /// Parent of the per-GPU MPS log directories.
    pub mps_log_root: AbsPath,
    /// The xCUDA shim preloaded into offline jobs.
    pub xcuda_library: AbsPath,
    /// The MPS control program.
    pub mps_control: AbsPath,
    /// libnvidia-ml to load; unset means the system's `libnvidia-ml.so.1`.
    pub nvml_library: Option<AbsPath>,
    /// GPU device files, `{index}` replaced by the GPU index.
    pub gpu_device: String,
    /// Log of the node programs (Prolog, Epilog, health check); `{node}` expands.
    pub node_log: AbsPath,
    /// The kernel log the NVIDIA driver writes Xid records to. The node
    /// programs read it from a cursor, so an Xid between two runs is still
    /// seen (NVML events reach only a program registered at that moment).
    /// Skipped with a debug line when unreadable. `{node}` expands.
    pub kernel_log: AbsPath,
    /// The cgroup v2 mount: where the `dmem` controller is looked for and
    /// an offline job's cgroup gets its GPU memory cap (`crate::node::dmem`).
    /// `{node}` expands.
    pub cgroup_root: AbsPath,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            state_dir: abs("/var/lib/muxflow"),
            mps_pipe_root: abs("/run/muxflow/mps"),
            mps_log_root: abs("/var/log/muxflow/mps"),
            xcuda_library: abs("/usr/lib/muxflow/libmuxflow_xcuda.so"),
            mps_control: abs("/usr/bin/nvidia-cuda-mps-control"),
            nvml_library: None,
            gpu_device: "/dev/nvidia{index}".to_string(),
            node_log: abs("/var/log/muxflow/node.log"),
            kernel_log: abs("/dev/kmsg"),
            cgroup_root: abs("/sys/fs/cgroup"),
        }
    }
}

/// How muxflow is modelled in Slurm.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Slurm {
    /// GRES name of the offline slot (one typed slot per GPU, `g<index>`).
    pub offline_gres: String,
    /// The scontrol the node side runs (root) to read slots and write AdminComment.
    pub scontrol: AbsPath,
    /// Longest wait for one scontrol call.
    pub command_timeout_ms: u64,
}

impl Default for Slurm {
    fn default() -> Self {
        Slurm {
            offline_gres: "mfslot".to_string(),
            scontrol: abs("/usr/bin/scontrol"),
            command_timeout_ms: 10_000,
        }
    }
}

/// Dynamic SM allocation and the memory cap of offline jobs.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// Lowest SM share an offline job gets.
    pub sm_floor: Percent,
    /// Highest SM share an offline job gets; the share under the bounded
    /// queue ([`OfflineGuard::Queue`]) on a board of full power.
    pub sm_ceiling: Percent,
    /// Margin kept above the online job's solo SM activity.
    pub sm_headroom: Percent,
    /// SM share when the online partner has no recorded solo activity.
    pub sm_default: Percent,
    /// GPU memory kept free for the online job's growth, MiB.
    pub memory_reserve_mib: u64,
    /// Under the bounded queue the offline share is `sm_ceiling` only on
    /// boards whose enforced power limit is at least this many watts; below
    /// it (power-capped inference boards: T4 70 W, A10 150 W) a wider share
    /// pulls the online job's SM clock down, so the share stays sized from
    /// its solo activity ([`crate::policy::share::offline_sm_budget`]).
    pub queue_ceiling_min_power_w: u32,
    /// Offline slots of one GPU, N ([`OFFLINE_PER_GPU`]); an offline job
    /// holding s of them gets a fixed s/N of the GPU's offline SM budget
    /// and memory room ([`crate::policy::share::offline_slot_share`]). gres.conf
    /// must give each GPU as many `mfslot` records (etc/gres.conf).
    pub offline_per_gpu: u8,
    /// Whose jobs may share a GPU ([`CoLocate`]); MPS's own rule (one user
    /// per GPU where the daemon is not multi-user) applies on top.
    pub co_locate: CoLocate,
    /// What keeps offline jobs off the online job's requests, which decides
    /// how many SMs their share must leave it ([`OfflineGuard`]). Not a key:
    /// [`Config::parse`] derives it from `[xcuda]` and `[mps]`.
    #[serde(skip)]
    pub guard: OfflineGuard,
}

/// What keeps an offline job off its online partner's requests: the SMs
/// its MPS share leaves the online job (space), or xCUDA's bounded queue
/// holding its launches while the online job serves a request (time).
/// Derived, never set: [`OfflineGuard::of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OfflineGuard {
    /// The share leaves the online job the SMs it was measured to use, plus
    /// headroom (`[policy] sm_*`); xCUDA's brakes act on top.
    Share,
    /// xCUDA's bounded queue is on and the online job publishes its busy
    /// periods (`[xcuda] queue_inflight` > 0 with `online_counting`): the
    /// offline job runs in the online job's gaps, so on a board that is not
    /// power-capped (`queue_ceiling_min_power_w`) its share is `[policy]
    /// sm_ceiling` and bounds only what it has in flight when a request
    /// arrives (xcuda/README.md, "The bounded offline queue").
    #[default]
    Queue,
}

impl OfflineGuard {
    /// The guard a config gives: the queue where it is on, the online job
    /// counted and no static SM partitions (a partition holds an offline
    /// job to its SMs whatever the queue does, so it is sized as a share).
    pub fn of(xcuda: &Xcuda, mps: &Mps) -> OfflineGuard {
        if xcuda.queue_inflight > 0 && xcuda.online_counting && !mps.sm_partitions {
            OfflineGuard::Queue
        } else {
            OfflineGuard::Share
        }
    }
}

/// `[policy] co_locate`: a site's rule for whose jobs may share one GPU
/// (and so one multi-user MPS server, where users are not isolated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CoLocate {
    /// Any user's offline job beside any user's online job.
    #[default]
    Any,
    /// Only jobs charged to one Slurm account share a GPU.
    SameAccount,
    /// Only one user's jobs share a GPU.
    SameUser,
}

/// Allowed values of `[policy] offline_per_gpu`.
pub const OFFLINE_PER_GPU: std::ops::RangeInclusive<u8> = 1..=4;

impl Default for Policy {
    fn default() -> Self {
        Policy {
            sm_floor: Percent(10),
            sm_ceiling: Percent(80),
            sm_headroom: Percent(10),
            sm_default: Percent(30),
            memory_reserve_mib: 2048,
            queue_ceiling_min_power_w: 200,
            offline_per_gpu: 1,
            co_locate: CoLocate::Any,
            guard: OfflineGuard::Queue,
        }
    }
}

/// Allowed ranges of the `[xcuda]` numbers, shared with xCUDA's own
/// reading of its settings.
pub const SAMPLE_INTERVAL_MS: std::ops::RangeInclusive<u64> = 1..=10_000;
pub const MAX_DELAY_US: std::ops::RangeInclusive<u64> = 0..=10_000_000;
/// `[xcuda] queue_inflight`: 0 (off) or a bound of launches in flight.
pub const QUEUE_INFLIGHT: std::ops::RangeInclusive<u64> = 0..=1024;
/// `[xcuda] queue_inflight_us`: 0 (launches only) or up to 100 ms of work.
pub const QUEUE_INFLIGHT_US: std::ops::RangeInclusive<u64> = 0..=100_000;
pub const DELAY_STEP_US: std::ops::RangeInclusive<u64> = 1..=1_000_000;

/// xCUDA's launch gate.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Xcuda {
    /// How often the watcher samples the GPU.
    pub sample_interval_ms: u64,
    /// Brake when the SM clock falls below this fraction of its maximum.
    pub clock_brake_fraction: Fraction,
    /// Brake when GPU utilization reaches this.
    pub utilization_brake: Percent,
    /// Largest delay put in front of one launch.
    pub max_delay_us: u64,
    /// Additive step of the delay when braking.
    pub delay_step_us: u64,
    /// Multiplicative release when the GPU has room (0.5 halves the delay).
    pub release_factor: Fraction,
    /// Preload xCUDA in counting mode into online jobs, so the offline
    /// gates see what the online job experiences (xcuda/README.md).
    pub online_counting: bool,
    /// Brake when the online job's GPU time per launch is this fraction
    /// above its baseline; three times it brakes hard (TGS's ratio of 3 %
    /// to 9 %). 0.04, chosen on the h100-like simulated GPU (three runs
    /// each, quiet machine): 0.03 (TGS's) p99 x1.05-1.09 with the trainer
    /// at 0.36-0.41 of its speed, 0.04 x0.92-1.06 and 0.58-0.73, 0.06
    /// x1.01-1.63 and 0.73-0.84 (xcuda/README.md).
    pub online_brake_deviation: Fraction,
    /// The bounded offline queue (xcuda/README.md): at least this many
    /// launches in flight on a stream while the GPU's online job is idle
    /// (more as `queue_inflight_us` allows), and none new while it is busy
    /// unless its measured slowdown allows; 0 leaves it off (the online
    /// trigger's per-launch delay instead). 2 by default: on the simulated
    /// h200-like GPU the queue kept the service at x1.04-1.05 at p50 and
    /// x1.02-1.04 at p99 with the trainer (at the SM ceiling the policy
    /// gives under the queue) at 0.54-0.56 of its solo speed, the trigger
    /// 0.15 (xcuda/README.md); no real GPU has measured it yet.
    pub queue_inflight: u64,
    /// The work the queue keeps in flight while the online job is idle, in
    /// microseconds of GPU time, measured at each drain: the bound in
    /// launches grows past `queue_inflight` while what is in flight takes
    /// less than this to drain (a trainer of short kernels: a few hundred
    /// a step, as a real ResNet-50 step) and falls back when it takes more.
    /// 0 keeps the bound at `queue_inflight` launches. 250 by default: a
    /// twentieth of the H200 service's request (5.6 ms of kernels), what a
    /// request that arrives waits behind at most (xcuda/README.md).
    pub queue_inflight_us: u64,
}

impl Default for Xcuda {
    fn default() -> Self {
        Xcuda {
            sample_interval_ms: 20,
            clock_brake_fraction: Fraction(0.95),
            utilization_brake: Percent(95),
            max_delay_us: 20_000,
            delay_step_us: 100,
            release_factor: Fraction(0.9),
            online_counting: true,
            online_brake_deviation: Fraction(0.04),
            queue_inflight: 2,
            queue_inflight_us: 250,
        }
    }
}

/// SysMonitor's per-GPU health state machine.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Health {
    /// Enter Busy at this utilization, leave it below `busy_exit_utilization`.
    pub busy_enter_utilization: Percent,
    pub busy_exit_utilization: Percent,
    /// Enter Overloaded at this utilization, leave it below the exit value.
    pub overloaded_enter_utilization: Percent,
    pub overloaded_exit_utilization: Percent,
    /// Enter Busy at this SM activity, leave it below the exit value.
    pub busy_enter_sm_activity: Percent,
    pub busy_exit_sm_activity: Percent,
    /// Overloaded when the SM clock falls below this fraction of its maximum.
    pub overloaded_enter_clock_fraction: Fraction,
    pub overloaded_exit_clock_fraction: Fraction,
    /// Overloaded at this share of GPU memory used.
    pub overloaded_enter_memory: Percent,
    pub overloaded_exit_memory: Percent,
    /// Least time in a state before leaving it (against flapping).
    pub min_dwell_s: u64,
    /// Quiet time in Recovering before Healthy again.
    pub recovery_quiet_s: u64,
    /// Samples of metric history kept per GPU.
    pub history_len: usize,
    /// How long the health check waits for NVML Xid events after its read
    /// (events are seen only while a program is registered for them).
    pub xid_watch_ms: u64,
    /// Re-send the published state at least this often, changed or not.
    pub publish_refresh_s: u64,
    /// How often `muxflow-police` checks an offline job's processes while
    /// the job runs (the health steps check them too).
    pub police_interval_ms: u64,
    /// How long `muxflow-sampler` (the node's SM activity sampler, started
    /// by the health steps) stays once no muxflow job is on the node and no
    /// step has asked for it.
    pub sampler_linger_s: u64,
    /// A job recorded on a GPU longer than this that Slurm no longer runs on
    /// the node (its Epilog never ran: slurmd restarted, the Epilog was
    /// killed) is forgotten by the health check, as its Epilog would have.
    pub forget_gone_jobs_after_s: u64,
    /// An offline job is cancelled once this many of its processes were
    /// terminated out of bounds (0: never; each is still terminated).
    pub police_cancel_after: u32,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            busy_enter_utilization: Percent(70),
            busy_exit_utilization: Percent(55),
            overloaded_enter_utilization: Percent(95),
            overloaded_exit_utilization: Percent(85),
            busy_enter_sm_activity: Percent(60),
            busy_exit_sm_activity: Percent(45),
            overloaded_enter_clock_fraction: Fraction(0.80),
            overloaded_exit_clock_fraction: Fraction(0.90),
            overloaded_enter_memory: Percent(95),
            overloaded_exit_memory: Percent(85),
            min_dwell_s: 30,
            recovery_quiet_s: 60,
            history_len: 64,
            xid_watch_ms: 0,
            publish_refresh_s: 300,
            police_interval_ms: 1000,
            sampler_linger_s: 30,
            forget_gone_jobs_after_s: 60,
            police_cancel_after: 3,
        }
    }
}

/// The controller-side matcher daemon.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Matcher {
    /// Seconds between rounds.
    pub interval_s: u64,
    /// Candidate GPUs kept per offline job before matching.
    pub candidates_per_job: usize,
    /// Most `scontrol update` calls one round makes; the rest wait a round.
    pub max_updates_per_round: usize,
    /// Days of sacct history the predictor learns from.
    pub history_days: u32,
    /// Longest wait for one Slurm command (squeue, sinfo, sacct, scontrol).
    pub command_timeout_s: u64,
    /// Time a round may spend pricing out the pairs left outside the
    /// candidate graph, which makes its matching of 1-GPU jobs exact over
    /// every feasible (job, GPU) pair; 0: exact on the candidates only.
    pub pricing_budget_ms: u64,
    /// Where each round writes the largest offline job each kind of GPU
    /// node can hold, for job_submit.lua to refuse at submit what no node
    /// ever could (its `MUXFLOW_SHAPE_FILE`, same default).
    pub shape_file: AbsPath,
}

impl Default for Matcher {
    fn default() -> Self {
        Matcher {
            interval_s: 60,
            candidates_per_job: 16,
            max_updates_per_round: 200,
            history_days: 30,
            command_timeout_s: 30,
            pricing_budget_ms: 5000,
            shape_file: abs("/var/lib/muxflow-matcher/cluster-shape"),
        }
    }
}

fn show_paths(paths: &[PathBuf]) -> String {
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    shown.join(", ")
}

/// Where a program looks for its config without `--config`: beside the
/// slurm.conf it works with (`slurm_conf`, see [`crate::config::slurm_conf`]), then
/// in `system_dir` (/etc/slurm); each place once.
pub fn search_paths(slurm_conf: Option<&Path>, system_dir: &Path) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    if let Some(conf) = slurm_conf {
        paths.push(crate::config::slurm_conf::conf_dir(Some(conf)).join(FILE_NAME));
    }
    let system = system_dir.join(FILE_NAME);
    if !paths.contains(&system) {
        paths.push(system);
    }
    paths
}

impl Config {
    /// Reads and validates the config at `path` (the plugin's: its path
    /// comes from plugstack's `config=`).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_set_by(path, PathSetting::Plugstack)
    }

    /// Reads and validates the config at `path`, chosen by `set_with`.
    pub fn load_set_by(path: &Path, set_with: PathSetting) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
            set_with,
        })?;
        Config::parse(&text, path)
    }

    /// The config of a program: `flag` (`--config PATH`) when given, else
    /// the first of [`search_paths`] that exists. A config that exists but
    /// cannot be read or is invalid is an error, never skipped for the
    /// next place. Returns the path used with the config.
    pub fn find(
        flag: Option<&Path>,
        slurm_conf: Option<&Path>,
    ) -> Result<(PathBuf, Config), ConfigError> {
        let system_dir = Path::new(DEFAULT_PATH).parent().unwrap_or(Path::new("/"));
        Config::find_in(flag, slurm_conf, system_dir)
    }

    /// [`find`](Config::find) with another system directory (tests).
    fn find_in(
        flag: Option<&Path>,
        slurm_conf: Option<&Path>,
        system_dir: &Path,
    ) -> Result<(PathBuf, Config), ConfigError> {
        if let Some(path) = flag {
            return Ok((
                path.to_path_buf(),
                Config::load_set_by(path, PathSetting::Flag)?,
            ));
        }
        let tried = search_paths(slurm_conf, system_dir);
        for path in &tried {
            match std::fs::metadata(path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                _ => return Ok((path.clone(), Config::load_set_by(path, PathSetting::Flag)?)),
            }
        }
        Err(ConfigError::NotFound { tried })
    }

    /// Parses config text; `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let mut cfg: Config = toml::from_str(text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            invalid(text, path, span, e.message())
        })?;
        cfg.policy.guard = OfflineGuard::of(&cfg.xcuda, &cfg.mps);
        cfg.validate(text, path)?;
        Ok(cfg)
    }

    /// Checks that span several keys.
    fn validate(&self, text: &str, path: &Path) -> Result<(), ConfigError> {
        let err = |section: &str, key: &str, msg: String| {
            let span = find_key(text, section, key).unwrap_or(0..0);
            let mut e = invalid(text, path, span, &msg);
            if let ConfigError::Invalid { key: k, .. } = &mut e {
                *k = format!("{section}.{key}");
            }
            Err(e)
        };
        for r in self.ranges() {
            if !(r.min..=r.max).contains(&r.value) {
                let why = if r.why.is_empty() {
                    String::new()
                } else {
                    format!(": {}", r.why)
                };
                return err(
                    r.section,
                    r.key,
                    format!(
                        "{} is out of range: allowed {}..={}{why}",
                        r.value, r.min, r.max
                    ),
                );
            }
        }
        if let Some(listen) = &self.metrics.listen {
            if parse_listen(listen).is_none() {
                return err(
                    "metrics",
                    "listen",
                    format!(
                        "'{listen}' is not a port or an address and port: write \"9842\" for loopback only (127.0.0.1:9842), or an interface's address and port such as \"10.0.0.5:9842\" to open it to other hosts (no host names, no port 0; or remove the key: no endpoint)"
                    ),
                );
            }
        }
        let p = &self.policy;
        if p.sm_floor > p.sm_ceiling {
            return err(
                "policy",
                "sm_floor",
                format!(
                    "sm_floor ({}) is above sm_ceiling ({}): make the floor the lower one",
                    p.sm_floor, p.sm_ceiling
                ),
            );
        }
        if p.sm_default < p.sm_floor || p.sm_default > p.sm_ceiling {
            return err(
                "policy",
                "sm_default",
                format!(
                    "sm_default ({}) must lie between sm_floor ({}) and sm_ceiling ({})",
                    p.sm_default, p.sm_floor, p.sm_ceiling
                ),
            );
        }
        if p.sm_floor.get() == 0 {
            return err(
                "policy",
                "sm_floor",
                "must be at least 1: an MPS client with 0% of the SMs cannot run".into(),
            );
        }
        if !OFFLINE_PER_GPU.contains(&p.offline_per_gpu) {
            return err(
                "policy",
                "offline_per_gpu",
                format!(
                    "{} offline jobs per GPU: use {} to {} (1 = one offline job beside each online job)",
                    p.offline_per_gpu,
                    OFFLINE_PER_GPU.start(),
                    OFFLINE_PER_GPU.end()
                ),
            );
        }
        let h = &self.health;
        let pairs = [
            (
                "busy_enter_utilization",
                h.busy_enter_utilization,
                "busy_exit_utilization",
                h.busy_exit_utilization,
            ),
            (
                "overloaded_enter_utilization",
                h.overloaded_enter_utilization,
                "overloaded_exit_utilization",
                h.overloaded_exit_utilization,
            ),
            (
                "busy_enter_sm_activity",
                h.busy_enter_sm_activity,
                "busy_exit_sm_activity",
                h.busy_exit_sm_activity,
            ),
            (
                "overloaded_enter_memory",
                h.overloaded_enter_memory,
                "overloaded_exit_memory",
                h.overloaded_exit_memory,
            ),
        ];
        for (enter_key, enter, exit_key, exit) in pairs {
            if exit > enter {
                return err(
                    "health",
                    exit_key,
                    format!("{exit_key} ({exit}) is above {enter_key} ({enter}): the exit threshold must not exceed the enter threshold (hysteresis)"),
                );
            }
        }
        if h.overloaded_exit_clock_fraction < h.overloaded_enter_clock_fraction {
            return err(
                "health",
                "overloaded_exit_clock_fraction",
                "must be at least overloaded_enter_clock_fraction: the clock must recover above where it entered (hysteresis)".into(),
            );
        }
        if self.mps.multiuser_flag.is_some() {
            return err(
                "mps",
                "multiuser_flag",
                format!(
                    "was removed: muxflow starts each daemon with NVIDIA's documented {} itself; delete the line, and write `multiuser = false` instead if the daemons must serve one user at a time",
                    crate::node::mps::MULTIUSER_FLAG
                ),
            );
        }
        if !self.paths.gpu_device.starts_with('/') || !self.paths.gpu_device.contains("{index}") {
            return err(
                "paths",
                "gpu_device",
                format!(
                    "'{}' must be an absolute path containing {{index}}, e.g. /dev/nvidia{{index}}",
                    crate::text::shorten(&self.paths.gpu_device)
                ),
            );
        }
        for (key, value) in [("offline_gres", &self.slurm.offline_gres)] {
            if value.is_empty() || !value.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return err(
                    "slurm",
                    key,
                    format!(
                        "'{}' must be a non-empty Slurm name of letters, digits and '_'",
                        crate::text::shorten(value)
                    ),
                );
            }
        }
        Ok(())
    }

    /// Every number of the file with its allowed range: a value outside it
    /// is refused where the file is read, naming file, line and key (an
    /// absurd value such as `memory_reserve_mib = 9223372036854775807` would
    /// otherwise wrap or silently disable a policy downstream).
    fn ranges(&self) -> Vec<Bounded> {
        const DAY_S: u64 = 86_400;
        let (p, x, h, m) = (&self.policy, &self.xcuda, &self.health, &self.matcher);
        let r = |section, key, value: u64, min, max, why| Bounded {
            section,
            key,
            value,
            min,
            max,
            why,
        };
        vec![
            r(
                "mps",
                "command_timeout_ms",
                self.mps.command_timeout_ms,
                1,
                600_000,
                "",
            ),
            r(
                "slurm",
                "command_timeout_ms",
                self.slurm.command_timeout_ms,
                1,
                600_000,
                "",
            ),
            r(
                "policy",
                "memory_reserve_mib",
                p.memory_reserve_mib,
                0,
                1 << 20,
                "MiB of GPU memory kept for the online job; no GPU has more than 1 TiB",
            ),
            r(
                "policy",
                "queue_ceiling_min_power_w",
                u64::from(p.queue_ceiling_min_power_w),
                0,
                10_000,
                "watts of a board's power limit; 0 gives every board the ceiling under the queue",
            ),
            r(
                "xcuda",
                "sample_interval_ms",
                x.sample_interval_ms,
                *SAMPLE_INTERVAL_MS.start(),
                *SAMPLE_INTERVAL_MS.end(),
                "",
            ),
            r(
                "xcuda",
                "max_delay_us",
                x.max_delay_us,
                *MAX_DELAY_US.start(),
                *MAX_DELAY_US.end(),
                "at most 10 s in front of one launch",
            ),
            r(
                "xcuda",
                "queue_inflight",
                x.queue_inflight,
                *QUEUE_INFLIGHT.start(),
                *QUEUE_INFLIGHT.end(),
                "0 is off; a few launches (4 to 16) is the useful range",
            ),
            r(
                "xcuda",
                "queue_inflight_us",
                x.queue_inflight_us,
                *QUEUE_INFLIGHT_US.start(),
                *QUEUE_INFLIGHT_US.end(),
                "0 keeps the bound in launches; a twentieth of the online job's request time is the aim",
            ),
            r(
                "xcuda",
                "delay_step_us",
                x.delay_step_us,
                *DELAY_STEP_US.start(),
                *DELAY_STEP_US.end(),
                "",
            ),
            r("health", "min_dwell_s", h.min_dwell_s, 0, DAY_S, ""),
            r(
                "health",
                "police_cancel_after",
                u64::from(h.police_cancel_after),
                0,
                1000,
                "0 never cancels (each process out of bounds is still terminated)",
            ),
            r(
                "health",
                "forget_gone_jobs_after_s",
                h.forget_gone_jobs_after_s,
                1,
                DAY_S,
                "a record is younger than its job's first listing in Slurm only for moments; a day keeps a GPU that long in the state of a job that is gone",
            ),
            r(
                "health",
                "police_interval_ms",
                h.police_interval_ms,
                100,
                60_000,
                "each check reads NVML and /proc for every process on the GPU: below 100 ms it costs a core's worth; above a minute a process out of bounds runs unpoliced that long",
            ),
            r(
                "health",
                "recovery_quiet_s",
                h.recovery_quiet_s,
                0,
                DAY_S,
                "",
            ),
            r(
                "health",
                "history_len",
                h.history_len as u64,
                1,
                100_000,
                "",
            ),
            r(
                "health",
                "xid_watch_ms",
                h.xid_watch_ms,
                0,
                50_000,
                "slurmd kills a HealthCheckProgram after 60 s",
            ),
            r(
                "health",
                "publish_refresh_s",
                h.publish_refresh_s,
                1,
                DAY_S,
                "",
            ),
            r("matcher", "interval_s", m.interval_s, 1, DAY_S, ""),
            r(
                "matcher",
                "candidates_per_job",
                m.candidates_per_job as u64,
                1,
                100_000,
                "",
            ),
            r(
                "matcher",
                "max_updates_per_round",
                m.max_updates_per_round as u64,
                1,
                1_000_000,
                "",
            ),
            r(
                "matcher",
                "history_days",
                u64::from(m.history_days),
                1,
                3650,
                "",
            ),
            r(
                "matcher",
                "command_timeout_s",
                m.command_timeout_s,
                1,
                3600,
                "",
            ),
            r(
                "matcher",
                "pricing_budget_ms",
                m.pricing_budget_ms,
                0,
                600_000,
                "",
            ),
        ]
    }

    /// The config as node `node` uses it: `{node}` in `state_dir`,
    /// `mps_pipe_root` and `mps_log_root` replaced by the node name.
    pub fn for_node(mut self, node: &str) -> Result<Config, ConfigError> {
        let ok = !node.is_empty()
            && node != "."
            && node != ".."
            && node
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !ok {
            return Err(ConfigError::BadNode(node.to_string()));
        }
        for p in [
            &mut self.paths.state_dir,
            &mut self.paths.mps_pipe_root,
            &mut self.paths.mps_log_root,
            &mut self.paths.node_log,
            &mut self.paths.kernel_log,
            &mut self.paths.cgroup_root,
        ]
        .into_iter()
        .chain(self.metrics.textfile_dir.as_mut())
        .chain(self.metrics.dcgm_job_mapping_dir.as_mut())
        {
            let s = p.0.to_string_lossy().replace("{node}", node);
            p.0 = PathBuf::from(s);
        }
        Ok(self)
    }

    /// Device file of GPU `index`.
    pub fn gpu_device(&self, index: u32) -> PathBuf {
        PathBuf::from(self.paths.gpu_device.replace("{index}", &index.to_string()))
    }
}

/// Builds an `Invalid` error for the byte range `span` of `text`.
/// One number of the file and the range it must lie in.
struct Bounded {
    section: &'static str,
    key: &'static str,
    value: u64,
    min: u64,
    max: u64,
    /// Why the bound, when it is not obvious.
    why: &'static str,
}

fn invalid(text: &str, path: &Path, span: Range<usize>, message: &str) -> ConfigError {
    let start = span.start.min(text.len());
    let line = text[..start].matches('\n').count() + 1;
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let column = text[line_start..start].chars().count() + 1;
    ConfigError::Invalid {
        path: path.to_path_buf(),
        line,
        column,
        key: key_at(text, start),
        message: message.trim().to_string(),
    }
}

/// The dotted key whose line holds byte `pos`: the enclosing `[table]` plus
/// the key before `=` on that line.
fn key_at(text: &str, pos: usize) -> String {
    let mut table = String::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let end = offset + line.len();
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            table = trimmed
                .trim_matches(|c| c == '[' || c == ']')
                .trim()
                .to_string();
            if pos < end {
                return table;
            }
        } else if pos < end || end == text.len() {
            let key = trimmed.split('=').next().unwrap_or("").trim();
            return match (table.is_empty(), key.is_empty()) {
                (_, true) => table,
                (true, false) => key.to_string(),
                (false, false) => format!("{table}.{key}"),
            };
        }
        offset = end;
    }
    table
}

/// Byte range of `key = …` inside `[section]`, if the file sets it.
fn find_key(text: &str, section: &str, key: &str) -> Option<Range<usize>> {
    let mut in_section = false;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            in_section = trimmed.trim_matches(|c| c == '[' || c == ']').trim() == section;
        } else if in_section && trimmed.split('=').next().map(str::trim) == Some(key) {
            let indent = line.len() - line.trim_start().len();
            return Some(offset + indent..offset + line.len());
        }
        offset += line.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/slurm/muxflow.toml"))
    }

    fn invalid_parts(text: &str) -> (usize, String, String) {
        match parse(text).unwrap_err() {
            ConfigError::Invalid {
                line,
                key,
                message,
                path,
                ..
            } => {
                assert_eq!(path, Path::new("/etc/slurm/muxflow.toml"));
                (line, key, message)
            }
            e => panic!("unexpected {e}"),
        }
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.policy.sm_default, Percent(30));
        assert_eq!(c.paths.state_dir.as_path(), Path::new("/var/lib/muxflow"));
        assert_eq!(
            c.paths.mps_pipe_root.as_path(),
            Path::new("/run/muxflow/mps")
        );
        assert_eq!(c.slurm.offline_gres, "mfslot");
        assert_eq!(c.matcher.interval_s, 60);
        assert_eq!(c.gpu_device(3), PathBuf::from("/dev/nvidia3"));
        assert!(c.paths.nvml_library.is_none());
    }

    #[test]
    fn the_offline_guard_follows_the_queue_and_the_partitions() {
        let cases: &[(&str, OfflineGuard, &str)] = &[
            ("", OfflineGuard::Queue, "the defaults: the queue on"),
            (
                "[xcuda]\nqueue_inflight = 0\n",
                OfflineGuard::Share,
                "the queue off",
            ),
            (
                "[xcuda]\nonline_counting = false\n",
                OfflineGuard::Share,
                "no online page: no busy periods to gate on",
            ),
            (
                "[mps]\nsm_partitions = true\n",
                OfflineGuard::Share,
                "a static partition holds the job to its SMs",
            ),
            (
                "[policy]\nsm_ceiling = 60\n[xcuda]\nqueue_inflight = 4\n",
                OfflineGuard::Queue,
                "any bound",
            ),
        ];
        for (text, want, why) in cases {
            assert_eq!(parse(text).unwrap().policy.guard, *want, "{why}");
        }
    }

    #[test]
    fn defaults_pass_validation() {
        let d = Config::default();
        d.validate("", Path::new("x")).unwrap();
    }

    #[test]
    fn shipped_sample_parses_and_matches_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("etc/muxflow.toml");
        let sample = Config::load(&path).unwrap();
        let d = Config::default();
        // The sample documents the defaults: they must agree.
        assert_eq!(format!("{:?}", sample.policy), format!("{:?}", d.policy));
        assert_eq!(format!("{:?}", sample.xcuda), format!("{:?}", d.xcuda));
        assert_eq!(format!("{:?}", sample.health), format!("{:?}", d.health));
        assert_eq!(format!("{:?}", sample.matcher), format!("{:?}", d.matcher));
        assert_eq!(format!("{:?}", sample.slurm), format!("{:?}", d.slurm));
        assert_eq!(format!("{:?}", sample.paths), format!("{:?}", d.paths));
        assert_eq!(format!("{:?}", sample.mps), format!("{:?}", d.mps));
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let (line, key, msg) = invalid_parts("[policy]\nsm_floor = 10\nsm_flor = 5\n");
        assert_eq!(line, 3);
        assert_eq!(key, "policy.sm_flor");
        assert!(msg.contains("unknown field `sm_flor`"), "{msg}");
    }

    #[test]
    fn unknown_table_is_an_error() {
        let (line, key, msg) = invalid_parts("# c\n[polcy]\nx = 1\n");
        assert_eq!(line, 2);
        assert_eq!(key, "polcy");
        assert!(msg.contains("unknown field `polcy`"), "{msg}");
    }

    #[test]
    fn wrong_type_names_key() {
        let (line, key, msg) = invalid_parts("[matcher]\n\ninterval_s = \"soon\"\n");
        assert_eq!((line, key.as_str()), (3, "matcher.interval_s"));
        assert!(msg.contains("invalid type"), "{msg}");
    }

    #[test]
    fn out_of_range_percent_names_fix() {
        let (line, key, msg) = invalid_parts("[policy]\nsm_ceiling = 140\n");
        assert_eq!((line, key.as_str()), (2, "policy.sm_ceiling"));
        assert!(msg.contains("0 to 100"), "{msg}");
    }

    #[test]
    fn bad_fraction_names_fix() {
        let (_, key, msg) = invalid_parts("[xcuda]\nclock_brake_fraction = 85\n");
        assert_eq!(key, "xcuda.clock_brake_fraction");
        assert!(msg.contains("0.0 to 1.0"), "{msg}");
    }

    #[test]
    fn relative_path_rejected() {
        let (_, key, msg) = invalid_parts("[paths]\nxcuda_library = \"lib/x.so\"\n");
        assert_eq!(key, "paths.xcuda_library");
        assert!(msg.contains("absolute"), "{msg}");
    }

    #[test]
    fn syntax_error_has_line() {
        let (line, _, _) = invalid_parts("[policy]\nsm_floor = = 3\n");
        assert_eq!(line, 2);
    }

    #[test]
    fn cross_key_checks_name_the_key_and_line() {
        let (line, key, msg) = invalid_parts("[policy]\nsm_ceiling = 20\nsm_floor = 50\n");
        assert_eq!((line, key.as_str()), (3, "policy.sm_floor"));
        assert!(msg.contains("above sm_ceiling"), "{msg}");

        let (line, key, msg) = invalid_parts("[health]\nbusy_exit_utilization = 90\n");
        assert_eq!((line, key.as_str()), (2, "health.busy_exit_utilization"));
        assert!(msg.contains("hysteresis"), "{msg}");

        let (_, key, _) = invalid_parts("[policy]\nsm_floor = 0\nsm_default = 0\n");
        assert_eq!(key, "policy.sm_floor");

        for bad in [0, 5] {
            let (line, key, msg) = invalid_parts(&format!("[policy]\noffline_per_gpu = {bad}\n"));
            assert_eq!((line, key.as_str()), (2, "policy.offline_per_gpu"));
            assert!(msg.contains("use 1 to 4"), "{msg}");
        }

        for bad in [0, 99, 60_001] {
            let (line, key, msg) =
                invalid_parts(&format!("[health]\npolice_interval_ms = {bad}\n"));
            assert_eq!((line, key.as_str()), (2, "health.police_interval_ms"));
            assert!(msg.contains("100") && msg.contains("60000"), "{msg}");
        }

        let (_, key, _) = invalid_parts("[paths]\ngpu_device = \"/dev/nvidia0\"\n");
        assert_eq!(key, "paths.gpu_device");

        let (_, key, _) = invalid_parts("[slurm]\noffline_gres = \"a b\"\n");
        assert_eq!(key, "slurm.offline_gres");
    }

    #[test]
    fn metrics_are_off_by_default_and_a_bad_listen_address_is_named() {
        let c: Config = toml::from_str("").unwrap();
        assert!(c.metrics.textfile_dir.is_none() && c.metrics.listen.is_none());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("muxflow.toml");
        for bad in [
            "localhost",
            "localhost:9842",
            "9842x",
            "127.0.0.1:0",
            "0",
            "99999",
            "",
        ] {
            std::fs::write(&path, format!("[metrics]\nlisten = \"{bad}\"\n")).unwrap();
            let e = Config::load(&path).unwrap_err().to_string();
            assert!(
                e.contains("metrics.listen") && e.contains("\"9842\" for loopback only"),
                "{bad}: {e}"
            );
        }
        // A port alone is loopback; another interface only as written.
        for (listen, addr) in [
            ("9842", "127.0.0.1:9842"),
            (":9842", "127.0.0.1:9842"),
            ("10.0.0.5:9842", "10.0.0.5:9842"),
            ("[::1]:9842", "[::1]:9842"),
            ("0.0.0.0:9842", "0.0.0.0:9842"),
        ] {
            std::fs::write(&path, format!("[metrics]\nlisten = \"{listen}\"\n")).unwrap();
            let c = Config::load(&path).unwrap();
            assert_eq!(
                c.metrics.listen_addr(),
                Some(addr.parse().unwrap()),
                "{listen}"
            );
        }
        std::fs::write(
            &path,
            "[metrics]\nlisten = \"127.0.0.1:9842\"\ntextfile_dir = \"/var/lib/{node}/prom\"\n",
        )
        .unwrap();
        let c = Config::load(&path).unwrap().for_node("n1").unwrap();
        assert_eq!(
            c.metrics.textfile_dir.unwrap().as_path(),
            Path::new("/var/lib/n1/prom")
        );
    }

    #[test]
    fn out_of_range_numbers_name_file_line_key_and_range() {
        struct Case {
            name: &'static str,
            text: &'static str,
            line: usize,
            key: &'static str,
            range: &'static str,
        }
        let cases = [
            Case {
                name: "i64::MAX memory reserve",
                text: "[policy]\nsm_floor = 10\nmemory_reserve_mib = 9223372036854775807\n",
                line: 3,
                key: "policy.memory_reserve_mib",
                range: "0..=1048576",
            },
            Case {
                name: "zero sample interval",
                text: "[xcuda]\nsample_interval_ms = 0\n",
                line: 2,
                key: "xcuda.sample_interval_ms",
                range: "1..=10000",
            },
            Case {
                name: "a delay of hours",
                text: "[xcuda]\nmax_delay_us = 99999999999\n",
                line: 2,
                key: "xcuda.max_delay_us",
                range: "0..=10000000",
            },
            Case {
                name: "xid watch past slurmd's kill",
                text: "[health]\nxid_watch_ms = 60000\n",
                line: 2,
                key: "health.xid_watch_ms",
                range: "0..=50000",
            },
            Case {
                name: "zero matcher interval",
                text: "[matcher]\ninterval_s = 0\n",
                line: 2,
                key: "matcher.interval_s",
                range: "1..=86400",
            },
        ];
        for c in cases {
            let (line, key, msg) = invalid_parts(c.text);
            assert_eq!((line, key.as_str()), (c.line, c.key), "{}", c.name);
            assert!(msg.contains(c.range), "{}: {msg}", c.name);
        }
        let e = Config::parse(
            "[policy]\nmemory_reserve_mib = 9223372036854775807\n",
            Path::new("/etc/slurm/muxflow.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("/etc/slurm/muxflow.toml:2:") && e.contains("policy.memory_reserve_mib"),
            "{e}"
        );
    }

    #[test]
    fn a_huge_value_is_echoed_cut() {
        let text = format!("[slurm]\noffline_gres = \"{}\"\n", " ".repeat(5000));
        let e = Config::parse(&text, Path::new("/m.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("… (5000 bytes)") && e.len() < 400, "{e}");
    }

    #[test]
    fn node_placeholder_expands_and_rejects_traversal() {
        let c = parse(
            "[paths]\nstate_dir = \"/srv/{node}/state\"\nmps_pipe_root = \"/run/mf/{node}\"\n",
        )
        .unwrap();
        let n = c.clone().for_node("node3").unwrap();
        assert_eq!(n.paths.state_dir.as_path(), Path::new("/srv/node3/state"));
        assert_eq!(n.paths.mps_pipe_root.as_path(), Path::new("/run/mf/node3"));
        assert_eq!(
            n.paths.mps_log_root.as_path(),
            Path::new("/var/log/muxflow/mps")
        );
        for bad in ["", "..", "a/b", "x y"] {
            assert!(
                matches!(c.clone().for_node(bad), Err(ConfigError::BadNode(_))),
                "{bad}"
            );
        }
    }

    /// One row per way a program finds (or misses) its config.
    #[test]
    fn programs_find_their_config_beside_slurm_conf_then_in_etc_slurm() {
        let dir = tempfile::tempdir().unwrap();
        let mkdir = |name: &str| {
            let d = dir.path().join(name);
            std::fs::create_dir_all(&d).unwrap();
            d
        };
        let (site, system, empty_system, other) = (
            mkdir("site"),
            mkdir("etc-slurm"),
            mkdir("etc-empty"),
            mkdir("other"),
        );
        std::fs::write(site.join(FILE_NAME), "[matcher]\ninterval_s = 7\n").unwrap();
        std::fs::write(system.join(FILE_NAME), "[matcher]\ninterval_s = 8\n").unwrap();
        let flagged = other.join("flagged.toml");
        std::fs::write(&flagged, "[matcher]\ninterval_s = 9\n").unwrap();
        let site_conf = site.join("slurm.conf");
        let other_conf = other.join("slurm.conf");

        struct Row<'a> {
            name: &'a str,
            flag: Option<&'a Path>,
            slurm_conf: Option<&'a Path>,
            system: &'a Path,
            want: Result<(PathBuf, u64), &'a [&'a str]>,
        }
        let rows = [
            Row {
                name: "beside $SLURM_CONF, before /etc/slurm",
                flag: None,
                slurm_conf: Some(&site_conf),
                system: &system,
                want: Ok((site.join(FILE_NAME), 7)),
            },
            Row {
                name: "/etc/slurm when none is beside $SLURM_CONF",
                flag: None,
                slurm_conf: Some(&other_conf),
                system: &system,
                want: Ok((system.join(FILE_NAME), 8)),
            },
            Row {
                name: "/etc/slurm without $SLURM_CONF",
                flag: None,
                slurm_conf: None,
                system: &system,
                want: Ok((system.join(FILE_NAME), 8)),
            },
            Row {
                name: "--config wins over the search",
                flag: Some(&flagged),
                slurm_conf: Some(&site_conf),
                system: &system,
                want: Ok((flagged.clone(), 9)),
            },
            Row {
                name: "none anywhere: the places tried and the flag",
                flag: None,
                slurm_conf: Some(&other_conf),
                system: &empty_system,
                want: Err(&[
                    "no muxflow config found: tried ",
                    "other/muxflow.toml, ",
                    "etc-empty/muxflow.toml;",
                    "--config PATH",
                ]),
            },
            Row {
                name: "a missing --config file: named, with the flag's fix",
                flag: Some(&other.join("nope.toml")),
                slurm_conf: Some(&site_conf),
                system: &system,
                want: Err(&["other/nope.toml", "give the path with --config PATH"]),
            },
        ];
        for row in rows {
            let got = Config::find_in(row.flag, row.slurm_conf, row.system);
            match (&row.want, got) {
                (Ok((path, interval)), Ok((p, c))) => {
                    assert_eq!(
                        (&p, c.matcher.interval_s),
                        (path, *interval),
                        "{}",
                        row.name
                    )
                }
                (Err(words), Err(e)) => {
                    let text = e.to_string();
                    for w in *words {
                        assert!(text.contains(w), "{}: {text}", row.name);
                    }
                    assert!(!text.contains("plugstack"), "{}: {text}", row.name);
                }
                (want, got) => panic!("{}: want {want:?}, got {got:?}", row.name),
            }
        }
        // A config that exists but is broken is an error, not skipped.
        std::fs::write(other.join(FILE_NAME), "[matcher]\ninterval_s = \"x\"\n").unwrap();
        let e = Config::find_in(None, Some(&other_conf), &system).unwrap_err();
        assert!(matches!(e, ConfigError::Invalid { .. }), "{e}");
        // Each place once.
        assert_eq!(
            search_paths(Some(&system.join("slurm.conf")), &system),
            [system.join(FILE_NAME)]
        );
    }

    #[test]
    fn missing_file_names_path_and_fix() {
        let e = Config::load(Path::new("/nonexistent/muxflow.toml")).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("/nonexistent/muxflow.toml") && s.contains("config="),
            "{s}"
        );
    }
}
