//! Mixed error handling, the part that is not SIGINT/SIGTERM: a table of
//! rules, each a pattern over one observation (an NVML Xid event, an MPS
//! server notice, an NVML failure, a lost GPU) and the actions it calls for.
//!
//! Only what the driver and the MPS server write themselves counts. The MPS
//! control daemon's `control.log` also records every user command and its
//! reply (`Cmd:<text>`, NVIDIA: "user commands issued and their result"),
//! and any job user can send commands, so it is never read here; a
//! `server.log` line counts only in the server's own `[<time> Server <pid>]
//! <notice>` form, matched from the start of the notice.
//!
//! Pure: [`classify`] maps observations to matches; `sysmon` carries the
//! actions out and counts them.

use std::fmt;

/// Something seen on one GPU during a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// An NVML XidCriticalError event with its Xid.
    Xid(u64),
    /// The notice of one line the GPU's MPS server wrote (see [`server_notice`]).
    MpsServer(String),
    /// An NVML query failed (not "lost"): what failed.
    NvmlFailure(String),
    /// NVML says the GPU is lost (NVML_ERROR_GPU_IS_LOST).
    Lost,
}

/// What muxflow does about a match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// Feed a fault to the state machine (Faulty: nothing placed, offline paused).
    MarkFaulty,
    /// `terminate_client` every offline MPS client on the GPU, so the online
    /// job is not taken down with them.
    EvictOffline,
    /// Quit and restart the GPU's MPS daemon, only when no online client is
    /// attached (a restart would kill it).
    RestartMpsIfNoOnline,
    /// Drain the node, reason `muxflow: gpu<i> lost`.
    DrainNode,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::MarkFaulty => "mark_faulty",
            Action::EvictOffline => "evict_offline",
            Action::RestartMpsIfNoOnline => "restart_mps",
            Action::DrainNode => "drain_node",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pattern over one observation.
#[derive(Debug, Clone, Copy)]
pub enum Pattern {
    /// An Xid from this list.
    Xid(&'static [u64]),
    /// An MPS server notice starting with this text.
    ServerSays(&'static str),
    /// Any NVML query failure.
    NvmlFailure,
    /// The GPU is lost.
    Lost,
}

impl Pattern {
    fn matches(&self, o: &Observation) -> bool {
        match (self, o) {
            (Pattern::Xid(list), Observation::Xid(x)) => list.contains(x),
            (Pattern::ServerSays(text), Observation::MpsServer(notice)) => notice.starts_with(text),
            (Pattern::NvmlFailure, Observation::NvmlFailure(_)) => true,
            (Pattern::Lost, Observation::Lost) => true,
            _ => false,
        }
    }
}

/// One rule: a name (logged and counted), a pattern, the actions.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub name: &'static str,
    pub pattern: Pattern,
    pub actions: &'static [Action],
}

use Action::*;

/// Xids after which the GPU needs a reset: double-bit ECC (48), GSP/engine
/// failures (62, 119, 120, 140), row-remap failure (64), NVLink (74), fallen
/// off the bus (79), high single-bit ECC rate (92), contained/uncontained ECC
/// (94, 95). Every client on the GPU is affected.
pub const FATAL_XIDS: &[u64] = &[48, 62, 64, 74, 79, 92, 94, 95, 119, 120, 140];

/// Xids caused by one application (graphics engine exception, MMU fault,
/// GPU stopped processing, preemptive cleanup): the suspect is the offline
/// client, which is cheaper to lose than the online one.
pub const APP_XIDS: &[u64] = &[13, 31, 43, 45, 69];

/// The rules, first match per observation wins.
pub const RULES: &[Rule] = &[
    Rule {
        name: "gpu_lost",
        pattern: Pattern::Lost,
        actions: &[MarkFaulty, EvictOffline, DrainNode],
    },
    Rule {
        name: "xid_fatal",
        pattern: Pattern::Xid(FATAL_XIDS),
        actions: &[MarkFaulty, EvictOffline, RestartMpsIfNoOnline],
    },
    Rule {
        name: "xid_app",
        pattern: Pattern::Xid(APP_XIDS),
        actions: &[MarkFaulty, EvictOffline],
    },
    Rule {
        name: "mps_fatal_gpu_error",
        pattern: Pattern::ServerSays("Server is handling a fatal GPU error"),
        actions: &[MarkFaulty, EvictOffline, RestartMpsIfNoOnline],
    },
    Rule {
        name: "mps_client_sticky_error",
        pattern: Pattern::ServerSays("The following clients have a sticky error set"),
        actions: &[MarkFaulty, EvictOffline, RestartMpsIfNoOnline],
    },
    Rule {
        name: "nvml_query_failed",
        pattern: Pattern::NvmlFailure,
        actions: &[MarkFaulty],
    },
];

/// The notice of a line of the MPS server's log, `[<date> <time> Server
/// <pid>] <notice>` (the real server writes "Server" in `server.log`, or
/// "Other" where its lines share a stream with the daemon's); None for any
/// other line.
pub fn server_notice(line: &str) -> Option<&str> {
    let rest = line.strip_prefix('[')?;
    let (header, notice) = rest.split_once("] ")?;
    let words: Vec<&str> = header.split_whitespace().collect();
    match words.as_slice() {
        [_date, _time, "Server" | "Other", pid] if pid.parse::<u32>().is_ok() => Some(notice),
        _ => None,
    }
}

/// A user command as the control daemon echoes it into `control.log`
/// (`[<date> <time> Control <pid>] Cmd:<command>`). Not a fault: who sent
/// it is unknown, which is why `sysmon` checks it against muxflow's own.
pub fn control_command(line: &str) -> Option<&str> {
    let rest = line.strip_prefix('[')?;
    let (header, notice) = rest.split_once("] ")?;
    let words: Vec<&str> = header.split_whitespace().collect();
    if !matches!(words.as_slice(), [_, _, "Control", pid] if pid.parse::<u32>().is_ok()) {
        return None;
    }
    notice.strip_prefix("Cmd:").map(str::trim)
}

/// The rule an observation matches, if any.
pub fn rule_for(o: &Observation) -> Option<&'static Rule> {
    RULES.iter().find(|r| r.pattern.matches(o))
}

/// The rules matched by a step's observations, in order, each once.
pub fn classify<'a>(
    observations: impl IntoIterator<Item = &'a Observation>,
) -> Vec<(&'static Rule, &'a Observation)> {
    let mut out: Vec<(&'static Rule, &'a Observation)> = Vec::new();
    for o in observations {
        if let Some(r) = rule_for(o) {
            if !out.iter().any(|(seen, _)| seen.name == r.name) {
                out.push((r, o));
            }
        }
    }
    out
}

/// The union of the actions of `matches`, in a fixed order.
pub fn actions(matches: &[(&'static Rule, &Observation)]) -> Vec<Action> {
    let mut a: Vec<Action> = matches
        .iter()
        .flat_map(|(r, _)| r.actions.iter().copied())
        .collect();
    a.sort_unstable();
    a.dedup();
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(line: &str) -> Observation {
        Observation::MpsServer(server_notice(line).unwrap_or(line).to_string())
    }

    fn name(o: &Observation) -> Option<&'static str> {
        rule_for(o).map(|r| r.name)
    }

    #[test]
    fn recorded_mps_server_lines() {
        struct Case {
            name: &'static str,
            line: &'static str,
            rule: Option<&'static str>,
        }
        // Lines as the MPS server writes them (the simulated one copies the format).
        let cases = [
            Case { name: "fatal error", line: "[2024-05-02 10:11:12.345 Server 4242] Server is handling a fatal GPU error.", rule: Some("mps_fatal_gpu_error") },
            Case { name: "sticky clients", line: "[2024-05-02 10:11:12.346 Server 4242] The following clients have a sticky error set: 5001, 5002", rule: Some("mps_client_sticky_error") },
            Case { name: "server on a shared stream", line: "[2021-06-27 07:30:26.837 Other    17] Server is handling a fatal GPU error.", rule: Some("mps_fatal_gpu_error") },
            Case { name: "client connected", line: "[2024-05-02 10:11:10.000 Server 4242] New client 5001 connected", rule: None },
            Case { name: "client gone", line: "[2024-05-02 10:11:11.000 Server 4242] Client 5001 disconnected", rule: None },
            Case { name: "eviction", line: "[2024-05-02 10:11:11.000 Server 4242] Terminating client 5001", rule: None },
            Case { name: "recovered", line: "[2024-05-02 10:11:20.000 Server 4242] All clients with a sticky error have exited; server has recovered from the fatal GPU error", rule: None },
        ];
        for c in cases {
            let notice =
                server_notice(c.line).unwrap_or_else(|| panic!("{}: not a server line", c.name));
            let o = Observation::MpsServer(notice.to_string());
            assert_eq!(name(&o), c.rule, "{}", c.name);
        }
    }

    #[test]
    fn text_a_user_can_write_is_no_server_notice() {
        // What a user's `echo '<text>' | nvidia-cuda-mps-control` leaves in
        // control.log (the real daemon's form), and other look-alikes.
        let forged = [
            "[2021-06-27 07:31:23.573 Control     6] Cmd:get_client_list Server is handling a fatal GPU error.",
            "[2021-06-27 07:31:23.573 Control     6] Server is handling a fatal GPU error.",
            "[2021-06-27 07:31:23.573 Control     6] Cmd:get_client_list FAULT",
            "Server is handling a fatal GPU error.",
            "[x] Server is handling a fatal GPU error.",
            "[2024-05-02 10:11:12.345 Server abc] Server is handling a fatal GPU error.",
        ];
        for line in forged {
            assert_eq!(server_notice(line), None, "{line}");
        }
        // A notice that only contains the words is not the notice.
        let o =
            Observation::MpsServer("Client 7 said: Server is handling a fatal GPU error.".into());
        assert_eq!(name(&o), None);
    }

    #[test]
    fn commands_in_the_control_log() {
        let cases = [
            (
                "[2021-06-27 07:31:23.573 Control     6] Cmd:terminate_client 17 4242",
                Some("terminate_client 17 4242"),
            ),
            (
                "[2021-06-27 07:31:23.573 Control 6] Cmd:get_server_list",
                Some("get_server_list"),
            ),
            ("[2021-06-27 07:31:23.573 Control 6] NEW UI", None),
            ("[2021-06-27 07:31:23.573 Control 6] 17", None),
            (
                "[2021-06-27 07:31:23.573 Server 17] Cmd:terminate_client 17 4242",
                None,
            ),
            ("Cmd:quit", None),
        ];
        for (line, want) in cases {
            assert_eq!(control_command(line), want, "{line}");
        }
    }

    #[test]
    fn recorded_xid_events() {
        for x in FATAL_XIDS {
            assert_eq!(name(&Observation::Xid(*x)), Some("xid_fatal"), "xid {x}");
        }
        for x in [13, 31, 43] {
            assert_eq!(name(&Observation::Xid(x)), Some("xid_app"), "xid {x}");
        }
        // Informational Xids (e.g. 63: row remapping pending) trigger nothing.
        assert_eq!(name(&Observation::Xid(63)), None);
        assert_eq!(name(&Observation::Xid(0)), None);
    }

    #[test]
    fn only_a_lost_gpu_drains() {
        let all = [
            Observation::Lost,
            Observation::Xid(79),
            Observation::Xid(31),
            Observation::NvmlFailure("utilization: Unknown".into()),
            log("Server is handling a fatal GPU error."),
            log("The following clients have a sticky error set: 1"),
        ];
        for o in &all {
            let r = rule_for(o).expect("every recorded fault matches a rule");
            assert_eq!(
                r.actions.contains(&DrainNode),
                matches!(o, Observation::Lost),
                "{o:?}"
            );
            assert!(r.actions.contains(&MarkFaulty), "{o:?}");
        }
        // A query failure alone evicts nothing: it may be muxflow's problem.
        assert_eq!(
            rule_for(&Observation::NvmlFailure("x".into()))
                .unwrap()
                .actions,
            &[MarkFaulty]
        );
    }

    #[test]
    fn classify_dedups_rules_and_unions_actions() {
        let obs = [
            log("Server is handling a fatal GPU error."),
            log("Server is handling a fatal GPU error."),
            Observation::Xid(31),
            log("New client 7 connected"),
        ];
        let m = classify(&obs);
        let names: Vec<_> = m.iter().map(|(r, _)| r.name).collect();
        assert_eq!(names, ["mps_fatal_gpu_error", "xid_app"]);
        assert_eq!(
            actions(&m),
            [MarkFaulty, EvictOffline, RestartMpsIfNoOnline]
        );
        assert!(actions(&classify(&[log("hello")])).is_empty());
    }

    #[test]
    fn rule_names_are_unique_and_every_rule_marks_faulty() {
        let mut names: Vec<_> = RULES.iter().map(|r| r.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), RULES.len());
        assert!(RULES.iter().all(|r| r.actions.contains(&MarkFaulty)));
    }
}
