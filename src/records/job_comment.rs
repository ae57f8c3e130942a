//! muxflow's words in a job's Comment: the one field a user looks at
//! (`squeue -O JobID,Reason,Comment`, `scontrol show job`) that a service
//! may write for a pending job. Slurm's reason column shows only Slurm's own
//! codes (`scontrol update JobId=N Reason=…` is refused for a job), so a job
//! muxflow holds reads `JobHeldUser`/`JobHeldAdmin` there, and this says
//! whose hold it is and why.
//!
//! The Comment is the user's too (`--comment`, `scontrol update`): nothing
//! here is trusted, it is only shown. muxflow writes it only where it is
//! empty or already muxflow's ([`is_muxflows`]), so a user's own comment is
//! never overwritten; the record muxflow trusts stays the AdminComment.
//!
//! | writer | when | text |
//! |---|---|---|
//! | `etc/job_submit.lua` | submit of an offline job | `muxflow: held until placed on a GPU` |
//! | muxflow-matcher | a parked job's reason changes | [`waiting`] |
//! | muxflow-matcher | a placement | [`placed`] |

use crate::records::placement::Waiting;

/// The start of every text muxflow writes into a job's Comment
/// (job_submit.lua's `COMMENT_PREFIX`, checked by a test).
pub const PREFIX: &str = "muxflow: ";

/// May muxflow write this Comment: empty, or muxflow's own?
pub fn is_muxflows(comment: &str) -> bool {
    comment.is_empty() || comment.starts_with(PREFIX)
}

/// A parked job's Comment: why it waits and since when (local time as
/// Slurm prints it).
pub fn waiting(why: Waiting, since: &str) -> String {
    format!("{PREFIX}waiting since {since}: {}", why.words())
}

/// A placed job's Comment: where muxflow put it (a gang: its GPUs).
pub fn placed(node: &str, gpus: &[u32]) -> String {
    let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
    let noun = if gpus.len() > 1 { "GPUs" } else { "GPU" };
    format!(
        "{PREFIX}placed on {node} {noun} {}, released to Slurm",
        list.join(",")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn muxflow_writes_only_an_empty_comment_or_its_own() {
        let cases = [
            ("empty", "", true),
            (
                "job_submit.lua's",
                "muxflow: held until placed on a GPU",
                true,
            ),
            ("the matcher's", &waiting(Waiting::FreeGpu, "t"), true),
            ("the user's", "run 3 of the sweep", false),
            ("the user's, naming muxflow", "muxflow run 3", false),
        ];
        for (name, text, ours) in cases {
            assert_eq!(is_muxflows(text), ours, "{name}: {text:?}");
        }
    }

    #[test]
    fn each_text_says_why_and_since_or_where() {
        let w = waiting(Waiting::SameUserOnly, "2026-11-23T12:14:05");
        assert!(
            w.starts_with(
                "muxflow: waiting since 2026-11-23T12:14:05: waiting for a GPU it may share"
            ),
            "{w}"
        );
        assert_eq!(
            placed("node3", &[1]),
            "muxflow: placed on node3 GPU 1, released to Slurm"
        );
        assert_eq!(
            placed("node3", &[0, 1]),
            "muxflow: placed on node3 GPUs 0,1, released to Slurm"
        );
        // No text of muxflow's holds a line break (Slurm keeps the Comment on one line).
        for w in Waiting::ALL {
            assert!(!waiting(w, "t").contains('\n'));
        }
    }
}
