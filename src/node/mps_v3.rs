//! MPS v3 namespaces: the daemon itself holds an offline job to its pinned
//! memory limit and thread percentage, where the job cannot leave its
//! namespace.
//!
//! What NVIDIA documents (MPS docs r615/r620, docs/notes/mps-multi-user-and-driver-limits.md):
//! a daemon started with `-p 3` speaks the "scriptable module verb
//! command syntax" to every later `nvidia-cuda-mps-control` invocation;
//! `-m`/`--multiuser` is v3's multi-user mode; `server create <name>`,
//! `namespace create <name> --server=<s>`, `namespace set <name>
//! --server=<s> [--pinned-memory-limit=<limit>]
//! [--active-thread-percentage=<pct>] [--client-priority=<p>]`,
//! `namespace delete <name> --server=<s> [--force]`, `namespace list`.
//! A namespace's thread percentage overrides the client's own variable, its
//! pinned limit is only tightened by the client's, its priority is the
//! client's default only. A client's namespace is chosen by the socket it
//! connects to, and (r620) on the main control socket by its cgroup or UID.
//!
//! Guesses (no NVIDIA page the search tools hold spells them; the
//! simulated daemon follows the same, and `real-gpu/run` checks them):
//! the v3 spelling of the v2 queries muxflow sends ([`spell`]), the option
//! binding a namespace to a cgroup ([`route`]), the CUDA version number of
//! r620 ([`CGROUP_ROUTING_MIN_VERSION`]), and the reply of `namespace list`
//! (one name a line).
//!
//! muxflow uses namespaces only where the daemon routes by cgroup: with
//! socket routing alone a job picks another namespace by its
//! `CUDA_MPS_PIPE_DIRECTORY`, which is the job's to change.

/// The lowest control daemon with MPS v3 (CUDA 13.4, driver r615).
pub const MIN_VERSION: u32 = 13040;
/// The lowest control daemon that routes clients by cgroup (driver r620;
/// its CUDA number, the release after 13.4, is a guess).
pub const CGROUP_ROUTING_MIN_VERSION: u32 = 13050;
/// `-p 3`: the daemon speaks v3.
pub const PROTOCOL_ARGS: [&str; 2] = ["-p", "3"];
/// v3's multi-user mode (MPS v3 Interface: "-m, --multiuser").
pub const MULTIUSER_FLAG: &str = "-m";
pub const MULTIUSER_FLAG_LONG: &str = "--multiuser";
/// The one named server muxflow creates on a v3 daemon.
pub const SERVER: &str = "muxflow";
/// The client priority an offline job's namespace defaults to (below
/// normal; a client that sets its own overrides it, NVIDIA says).
pub const OFFLINE_PRIORITY: u8 = 1;

/// The grammar a daemon speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// Legacy MPS v2: `get_server_list`, `terminate_client <s> <c>`, ...
    #[default]
    V2,
    /// MPS v3: `module verb [args] [--options]`.
    V3,
}

/// What a node's control daemon offers, by its version (`-v`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// No v3 (or no version printed).
    Absent,
    /// v3 with routing by socket only: a job can leave its namespace.
    SocketRouting(u32),
    /// v3 that routes clients of the main socket by cgroup.
    CgroupRouting(u32),
}

impl Support {
    pub fn of(version: Option<u32>) -> Support {
        match version {
            Some(v) if v >= CGROUP_ROUTING_MIN_VERSION => Support::CgroupRouting(v),
            Some(v) if v >= MIN_VERSION => Support::SocketRouting(v),
            _ => Support::Absent,
        }
    }

    /// Whether muxflow puts offline jobs in namespaces here.
    pub fn usable(&self) -> bool {
        matches!(self, Support::CgroupRouting(_))
    }
}

/// A command muxflow sends today that a v3 daemon is not sent (static SM
/// partitions, which muxflow uses only on a v2 daemon).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' has no MPS v3 spelling muxflow uses (static SM partitions run on a v2 daemon only)")]
pub struct Unspoken(pub String);

/// The one place that knows both grammars: muxflow's command `v2` (as
/// written for a v2 daemon) as a daemon of `protocol` is sent it.
pub fn spell(protocol: Protocol, v2: &str) -> Result<String, Unspoken> {
    if protocol == Protocol::V2 {
        return Ok(v2.to_string());
    }
    let w: Vec<&str> = v2.split_whitespace().collect();
    let text = match w.as_slice() {
        ["quit"] => "quit".to_string(),
        ["get_server_list"] => "server list".to_string(),
        ["get_client_list", server] => format!("client list --server-pid={server}"),
        ["terminate_client", server, client] => {
            format!("client terminate {client} --server-pid={server}")
        }
        ["get_default_active_thread_percentage"] => {
            format!("server get {SERVER} active_thread_percentage")
        }
        ["set_default_active_thread_percentage", pct] => {
            format!("server set {SERVER} --active-thread-percentage={pct}")
        }
        _ => return Err(Unspoken(v2.to_string())),
    };
    Ok(text)
}

/// `server create muxflow`: the server muxflow's namespaces live on (the
/// daemon's `-m` makes it serve every user).
pub fn server_create() -> String {
    format!("server create {SERVER}")
}

/// A namespace name for job `job_id` (NVIDIA: lowercase letters, digits
/// and underscores, up to 64).
pub fn name(job_id: u32) -> String {
    format!("job_{job_id}")
}

pub fn create(ns: &Namespace) -> String {
    format!("namespace create {} --server={SERVER}", ns.name)
}

/// `namespace set` with the limits the namespace holds.
pub fn set_limits(ns: &Namespace) -> String {
    let mut c = format!("namespace set {} --server={SERVER}", ns.name);
    if let Some(mib) = ns.mem_mib {
        c += &format!(" --pinned-memory-limit={mib}M");
    }
    c += &format!(
        " --active-thread-percentage={} --client-priority={}",
        ns.sm_pct, ns.priority
    );
    c
}

/// Binds the namespace to the job's cgroup (r620 routing; the option's
/// spelling is a guess, see the module's notes).
pub fn route(ns: &Namespace) -> String {
    format!(
        "namespace set {} --server={SERVER} --cgroup={}",
        ns.name, ns.cgroup
    )
}

pub fn delete(name: &str) -> String {
    format!("namespace delete {name} --server={SERVER} --force")
}

pub const LIST: &str = "namespace list";

/// Whether `namespace list`'s reply names `name` (one name a line, or the
/// name as the first word of a line).
pub fn listed(reply: &str, name: &str) -> bool {
    reply
        .lines()
        .any(|l| l.split_whitespace().next() == Some(name))
}

/// Does a daemon's command line say v3 (`-p 3`, `-p3`, `--protocol=3`)?
pub fn args_say_v3(args: &[String]) -> bool {
    args.windows(2).any(|w| w[0] == "-p" && w[1] == "3")
        || args.iter().any(|a| a == "-p3" || a == "--protocol=3")
}

/// Does a v3 daemon's command line say multi-user?
pub fn args_say_multiuser(args: &[String]) -> bool {
    args.iter()
        .any(|a| a == MULTIUSER_FLAG || a == MULTIUSER_FLAG_LONG)
}

/// State-changing v3 commands (`module verb`): muxflow notes its own, the
/// detector tells a user's from them (as [`crate::node::mps::CHANGING_COMMANDS`]
/// for v2).
pub fn is_changing(command: &str) -> bool {
    let mut w = command.split_whitespace();
    match (w.next(), w.next()) {
        (Some("quit"), _) => true,
        (Some("server" | "namespace" | "client" | "partition"), Some(verb)) => matches!(
            verb,
            "create" | "set" | "delete" | "terminate" | "add" | "rm" | "remove"
        ),
        _ => false,
    }
}

/// An offline job's namespace as the Prolog made it (`<gpu
/// dir>/namespaces/<job>`): what the daemon holds the job to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    pub name: String,
    /// The job's cgroup, from the cgroup root (`/system.slice/...`).
    pub cgroup: String,
    pub mem_mib: Option<u64>,
    pub sm_pct: u8,
    pub priority: u8,
}

impl Namespace {
    /// Job `job_id`'s namespace with its share, bound to its cgroup
    /// (`cgroup`, from the cgroup root, as the release names it:
    /// [`crate::node::dmem::job_cgroup_for_prolog`]).
    pub fn for_job(job_id: u32, cgroup: &str, mem_mib: Option<u64>, sm_pct: u8) -> Namespace {
        Namespace {
            name: name(job_id),
            cgroup: cgroup.to_string(),
            mem_mib,
            sm_pct: sm_pct.clamp(1, 100),
            priority: OFFLINE_PRIORITY,
        }
    }

    pub fn encode(&self) -> String {
        format!(
            "name={}\ncgroup={}\nmem_mib={}\nsm_pct={}\npriority={}\n",
            self.name,
            self.cgroup,
            self.mem_mib.map_or("none".to_string(), |m| m.to_string()),
            self.sm_pct,
            self.priority
        )
    }

    pub fn decode(text: &str) -> Option<Namespace> {
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
                .map(str::trim)
                .filter(|v| !v.is_empty() && !v.contains(char::is_whitespace))
        };
        let mem_mib = match get("mem_mib")? {
            "none" => None,
            m => Some(m.parse().ok()?),
        };
        Some(Namespace {
            name: get("name")?.to_string(),
            cgroup: get("cgroup")?.to_string(),
            mem_mib,
            sm_pct: get("sm_pct")?.parse().ok()?,
            priority: get("priority")?.parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_muxflow_sends_has_one_spelling_per_grammar() {
        // (v2 text, what a v3 daemon is sent)
        let table = [
            ("quit", Some("quit")),
            ("get_server_list", Some("server list")),
            ("get_client_list 42", Some("client list --server-pid=42")),
            (
                "terminate_client 42 77",
                Some("client terminate 77 --server-pid=42"),
            ),
            (
                "get_default_active_thread_percentage",
                Some("server get muxflow active_thread_percentage"),
            ),
            (
                "set_default_active_thread_percentage 100",
                Some("server set muxflow --active-thread-percentage=100"),
            ),
            ("sm_partition add GPU-1 9", None),
            ("sm_partition rm GPU-1 GPU-1/p1", None),
            ("lspart", None),
        ];
        for (v2, v3) in table {
            assert_eq!(spell(Protocol::V2, v2).as_deref(), Ok(v2), "v2 as is");
            assert_eq!(spell(Protocol::V3, v2).ok().as_deref(), v3, "{v2}");
        }
        // Each v3 spelling that changes something reads as such.
        for c in [
            "quit",
            "client terminate 77 --server-pid=42",
            "server set muxflow --active-thread-percentage=100",
            "namespace delete job_7 --server=muxflow --force",
        ] {
            assert!(is_changing(c), "{c}");
        }
        for c in ["server list", "client list --server-pid=4", LIST] {
            assert!(!is_changing(c), "{c}");
        }
    }

    #[test]
    fn namespaces_only_where_the_daemon_routes_by_cgroup() {
        for (v, want, usable) in [
            (None, Support::Absent, false),
            (Some(13010), Support::Absent, false),
            (Some(13040), Support::SocketRouting(13040), false),
            (Some(13050), Support::CgroupRouting(13050), true),
        ] {
            let s = Support::of(v);
            assert_eq!(s, want, "{v:?}");
            assert_eq!(s.usable(), usable, "{v:?}");
        }
    }

    #[test]
    fn a_jobs_namespace_holds_its_share_routed_by_its_cgroup() {
        let ns = Namespace::for_job(12, "/system.slice/slurmstepd.scope/job_12", Some(4096), 30);
        assert_eq!(ns.name, "job_12");
        assert_eq!(ns.cgroup, "/system.slice/slurmstepd.scope/job_12");
        assert_eq!(create(&ns), "namespace create job_12 --server=muxflow");
        assert_eq!(
            set_limits(&ns),
            "namespace set job_12 --server=muxflow --pinned-memory-limit=4096M --active-thread-percentage=30 --client-priority=1"
        );
        assert_eq!(
            route(&ns),
            "namespace set job_12 --server=muxflow --cgroup=/system.slice/slurmstepd.scope/job_12"
        );
        assert_eq!(Namespace::decode(&ns.encode()), Some(ns.clone()));
        let no_cap = Namespace::for_job(3, "/system.slice/slurmstepd.scope/job_3", None, 0);
        assert_eq!(no_cap.sm_pct, 1);
        assert!(!set_limits(&no_cap).contains("pinned"));
        assert_eq!(Namespace::decode(&no_cap.encode()), Some(no_cap));
        assert_eq!(Namespace::decode("name=a b\ncgroup=/x\n"), None);
        assert!(listed("default\njob_12\n", "job_12"));
        assert!(!listed("default\njob_120\n", "job_12"));
        let args = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert!(args_say_v3(&args("nvidia-cuda-mps-control -d -p 3 -m")));
        assert!(args_say_multiuser(&args(
            "nvidia-cuda-mps-control -d -p 3 -m"
        )));
        assert!(!args_say_v3(&args(
            "nvidia-cuda-mps-control -d -multiuser-server"
        )));
    }
}
