--[[
muxflow job_submit.lua — turns `--muxflow=online|offline` into Slurm terms.

Install next to slurm.conf (as job_submit.lua) with JobSubmitPlugins=lua.
If you already have a job_submit.lua, call muxflow_job_submit(job_desc) from
your slurm_job_submit.

The muxflow SPANK plugin exports MUXFLOW_MODE at submit; it arrives here in
job_desc.spank_job_env. Then:

  offline  The job takes an offline slot (GRES `mfslot`, one typed slot per
           GPU, bound to the GPU's device file; see gres.conf) instead of any
           GPU. It is parked — held (priority 0, Reason=JobHeldUser) and with
           no slot yet — until muxflow-matcher places it (the matcher's
           rounds turn the hold into its own, Reason=JobHeldAdmin, with why
           it waits in AdminComment: `waiting=free_gpu ...`):
             scontrol update JobId=N ReqNodeList=<node> Gres=mfslot:g<i>:1 \
                 AdminComment="muxflow:v1 mode=offline placed=<node>:g<i>"
             scontrol release N
           Slurm 22.05 rejects at submit a constraint no node has, cannot turn
           an untyped GRES request into a typed one later, and keeps the old
           typed request when a typed one is rewritten: so the slot is written
           once, by the matcher, while the job is held. An offline job
           released unplaced (only root or SlurmUser can) holds no GPU: the
           Prolog refuses it and it goes back to the queue, held.
           Refused at submit, with a message naming the option and what to
           do instead (offline_refusal): --exclusive (an offline job shares
           its node and GPU by design), more than one node (-N 2, -N 1-2),
           GPUs per task or per socket (--gpus-per-task with several tasks:
           ask with --gres=gpu:N): it would otherwise wait forever, fail
           when its tasks start, or run on less than asked; and --no-requeue
           (muxflow requeues an offline job when an online job lands on its
           GPU); and a job no GPU node could ever hold (more GPUs, CPUs or
           memory on one node than any has: Slurm's own check does not see
           the GPUs taken out below; the matcher writes the nodes' shapes
           each round to SHAPE_FILE); a heterogeneous job (its components
           would be placed one by one, never started together); -H/--hold
           (indistinguishable from the parking hold: use --begin, or hold
           the job once placed). An offline job asking for N GPUs of its node (--gres=gpu:N,
           --gpus=N) is recorded as `gpus=N` and placed as a gang of N slots
           of one node; each of its tasks gets one of them.
  online   The job keeps its gres/gpu request and is tagged in AdminComment so
           the matcher finds it.

Only muxflow places offline work (on Slurm 22.05, checked on the dev cluster):
  * at submit, a job that is not --muxflow=offline and asks for the offline
    slot in any form (--gres, --gpus-per-*, --tres-per-*: tres_per_node,
    tres_per_job, tres_per_socket, tres_per_task) is refused with a message;
  * on `scontrol update`/`release` (both reach slurm_job_modify: release is
    priority=INFINITE, hold priority=0), a user who is not root or SlurmUser
    may not add the offline slot to any job, nor change a muxflow offline
    job's slot, node list (ReqNodeList, ExcNodeList), features, preference
    or release its hold. The matcher runs as root or SlurmUser. Holding one's
    own job stays allowed, and so does releasing one's own hold of a placed
    job (the matcher leaves a job its owner holds alone until then). Slurm 22.05 does not show a job_modify message to
    the user (bug 14539): scontrol prints "Access/permission denied".
  * muxflow-matcher writes its placement into the AdminComment (only root,
    SlurmUser and admins can), and the Prolog refuses an offline job whose
    slot is not the one written there, or whose GPU is not healthy.

Without a running matcher, parked offline jobs wait. Set PARK_OFFLINE = false
below as the fallback: offline jobs then ask for any offline slot (untyped
mfslot:1) and Slurm starts them on any free one (any GPU, whether or not an
online job runs there; the node health checks still pause offline work on
GPUs that are not healthy).
]]

-- Keep in step with muxflow.toml [slurm] offline_gres.
local OFFLINE_GRES = "mfslot"
local PARK_OFFLINE = true
-- The AdminComment protocol, owned by src/records/admin_comment.rs (its test checks
-- these constants against the Rust definitions, and that no other line here
-- spells a protocol word out).
local TAG = "muxflow:v1"
local KEY_MODE = "mode"
local KEY_GPUS = "gpus"
local KEY_PLACED = "placed"
local PLACED_ANY = "any"
local MODE_OFFLINE = "offline"
local MODE_ONLINE = "online"
-- The start of muxflow's words in a job's Comment (the matcher writes over
-- a Comment that starts so, never over a user's own).
local COMMENT_PREFIX = "muxflow: "
-- Slurm's NO_VAL (32-bit): job_desc.priority when the update leaves it alone.
local NO_VAL = 4294967294
-- Fields that can carry a GRES request.
local TRES_FIELDS = { "tres_per_node", "tres_per_job", "tres_per_socket", "tres_per_task" }
-- A user may not change these on a muxflow offline job: where it runs is the matcher's.
local PLACEMENT_FIELDS = { "req_nodes", "exc_nodes", "features", "prefer", "cluster_features" }

-- The uid slurmctld (and so this script) runs as: SlurmUser. Read from
-- /proc rather than by running a program inside slurmctld.
local function own_uid()
	local f = io.open("/proc/self/status", "r")
	if f == nil then
		return 0
	end
	for line in f:lines() do
		local uid = string.match(line, "^Uid:%s+(%d+)")
		if uid ~= nil then
			f:close()
			return tonumber(uid)
		end
	end
	f:close()
	return 0
end
local SLURM_USER_UID = own_uid()

-- Root and SlurmUser (muxflow-matcher runs as one of them).
local function privileged(uid)
	return uid == 0 or uid == SLURM_USER_UID
end

-- Does a TRES string ("gres:gpu:1,gres:mfslot:g0:1") name the offline slot?
local function names_offline_slot(tres)
	if tres == nil then
		return false
	end
	for item in string.gmatch(tres, "[^,]+") do
		local name = string.match(item, "^gres[:/]([^:,]+)")
		if name == OFFLINE_GRES then
			return true
		end
	end
	return false
end

-- The first field of job_desc that asks for the offline slot, or nil.
local function offline_slot_request(job_desc)
	for _, field in ipairs(TRES_FIELDS) do
		if names_offline_slot(job_desc[field]) then
			return field, job_desc[field]
		end
	end
	return nil
end

local function muxflow_mode(job_desc)
	local env = job_desc.spank_job_env
	if env == nil then
		return nil
	end
	for _, entry in pairs(env) do
		local mode = string.match(entry, "^MUXFLOW_MODE=(.*)$")
		if mode ~= nil then
			return mode
		end
	end
	return nil
end

-- Slurm's NO_VAL16: job_desc.shared when no --exclusive/--oversubscribe was given.
local NO_VAL16 = 65534
-- job_desc.shared: JOB_SHARED_NONE (--exclusive), _OK (--oversubscribe),
-- _USER (--exclusive=user), _MCS (--exclusive=mcs).
local SHARED_OK = 1

-- GPUs a TRES string asks for: "gres:gpu:4", "gres:gpu:a100:2", "gres:gpu"
-- (one). Other GRES are not counted.
local function gpu_count(tres)
	local n = 0
	if tres == nil then
		return 0
	end
	for item in string.gmatch(tres, "[^,]+") do
		local rest = string.match(item, "^gres[:/]gpu(.*)$")
		if rest ~= nil then
			local count = string.match(rest, ":(%d+)$")
			n = n + (tonumber(count) or 1)
		end
	end
	return n
end

local function set(v)
	return v ~= nil and v ~= NO_VAL and v ~= 0
end

-- Does the job name GPUs in any field (--gres=gpu:N, --gpus=N, per task
-- or socket), whatever the count, zero included?
local function names_gpus(job_desc)
	for _, field in ipairs(TRES_FIELDS) do
		local tres = job_desc[field]
		if tres ~= nil then
			for item in string.gmatch(tres, "[^,]+") do
				if string.match(item, "^gres[:/]gpu") then
					return true
				end
			end
		end
	end
	return false
end

-- GPUs the job asks for in all its fields.
local function gpus_asked(job_desc)
	local n = 0
	for _, field in ipairs(TRES_FIELDS) do
		n = n + gpu_count(job_desc[field])
	end
	return n
end

-- GPUs an offline job asks for on its one node (--gres=gpu:N, --gpus=N):
-- the matcher places N slots of one node as a gang. At least 1.
local function offline_gpus(job_desc)
	local gpus = 1
	for _, field in ipairs({ "tres_per_node", "tres_per_job" }) do
		gpus = math.max(gpus, gpu_count(job_desc[field]))
	end
	return gpus
end

-- Why an offline job cannot run as asked (a message naming the option and
-- what to do instead), or nil. Offline work runs in offline slots of one
-- node, placed by the matcher: an option that cannot be met there is
-- refused now rather than accepted and left pending (or started on less
-- than asked).
local function offline_refusal(job_desc)
	-- Each component of a heterogeneous job comes here with its offset
	-- (NO_VAL for other jobs). Refused rather than placed as a whole: Slurm
	-- starts the components only together and on their own nodes, while
	-- muxflow places each offline job on one GPU of one node as its own
	-- job; components placed one by one would hold GPUs idle for good.
	local het = job_desc.het_job_offset
	if het ~= nil and het ~= NO_VAL then
		return "a heterogeneous job (components separated by ':' or #SBATCH hetjob) cannot be used with "
			.. "--muxflow=offline: Slurm starts its components only together, and muxflow places each offline job "
			.. "on its own GPU. Submit each component as a job of its own (--dependency to order them), or submit "
			.. "without --muxflow"
	end
	-- A hold at submit is priority 0, as is muxflow's own parking: the
	-- matcher could not tell them apart and would release it.
	if job_desc.priority == 0 then
		return "-H/--hold cannot be used with --muxflow=offline: muxflow keeps an offline job held until it places "
			.. "it. Submit without --hold; to start it later use --begin=<time>, or hold it once placed "
			.. "(scontrol hold <id>, then scontrol release <id>): muxflow leaves a job its owner holds alone"
	end
	local shared = job_desc.shared
	if shared ~= nil and shared ~= NO_VAL16 and shared ~= SHARED_OK then
		return "--exclusive cannot be used with --muxflow=offline: an offline job shares its node and GPU "
			.. "with an online job by design. Drop --exclusive, or submit without --muxflow to get whole nodes"
	end
	if job_desc.requeue == 0 then
		return "--no-requeue cannot be used with --muxflow=offline: muxflow puts an offline job back in the "
			.. "queue when an online job needs its GPU (or its GPU turns unhealthy before it starts). "
			.. "Drop --no-requeue (make the job restartable), or submit without --muxflow"
	end
	local min_nodes, max_nodes = job_desc.min_nodes, job_desc.max_nodes
	if (set(min_nodes) and min_nodes > 1) or (set(max_nodes) and max_nodes > 1) then
		local asked = tostring(set(min_nodes) and min_nodes or max_nodes)
		if set(min_nodes) and set(max_nodes) and max_nodes ~= min_nodes then
			asked = min_nodes .. "-" .. max_nodes
		end
		return "-N/--nodes=" .. asked .. " cannot be used with --muxflow=offline: an offline job runs on one node "
			.. "(multi-node offline jobs are not supported). Submit with -N 1, or without --muxflow"
	end
	for _, field in ipairs({ "tres_per_socket", "tres_per_task" }) do
		if gpu_count(job_desc[field]) > 0 then
			local tasks = job_desc.num_tasks
			local per = gpu_count(job_desc[field])
			if field == "tres_per_socket" or (set(tasks) and tasks > 1) or per > 1 then
				return "GPUs per task or per socket (--gpus-per-task, --gpus-per-socket) cannot be used with "
					.. "--muxflow=offline: an offline job's GPUs are counted per node. Ask for them with "
					.. "--gres=gpu:N (N GPUs of one node, one task per GPU gets its own), "
					.. "or submit without --muxflow"
			end
		end
	end
	return nil
end

-- The cluster's shape, written by muxflow-matcher each round ([matcher]
-- shape_file): per kind of GPU node, the most GPUs, CPUs and memory (MiB)
-- one job can get there. slurmctld's environment may name another path.
local SHAPE_FILE = os.getenv("MUXFLOW_SHAPE_FILE") or "/var/lib/muxflow-matcher/cluster-shape"
-- Older than this (no matcher running): refuse nothing.
local SHAPE_MAX_AGE_S = 900

-- The shapes ({gpus, cpus, mem_mib} each), or nil when the file is
-- missing, stale or holds none.
local function cluster_shapes()
	local f = io.open(SHAPE_FILE, "r")
	if f == nil then
		return nil
	end
	local shapes, written_at = {}, nil
	for line in f:lines() do
		local at = string.match(line, "^written_at=(%d+)$")
		if at ~= nil then
			written_at = tonumber(at)
		end
		local g, c, m = string.match(line, "^node gpus=(%d+) cpus=(%d+) mem_mib=(%d+)$")
		if g ~= nil then
			table.insert(shapes, { gpus = tonumber(g), cpus = tonumber(c), mem_mib = tonumber(m) })
		end
	end
	f:close()
	if written_at == nil or os.time() - written_at > SHAPE_MAX_AGE_S or #shapes == 0 then
		return nil
	end
	return shapes
end

-- A count the job gave (not Slurm's "unset" values), or nil.
local function given(v)
	if v == nil or v == NO_VAL or v == NO_VAL16 or v <= 0 then
		return nil
	end
	return v
end

-- CPUs and memory (MiB, 0: not asked) an offline job needs on its one node.
local function offline_room(job_desc)
	local tasks = given(job_desc.num_tasks) or 1
	local cpus = (given(job_desc.cpus_per_task) or 1) * tasks
	cpus = math.max(cpus, given(job_desc.min_cpus) or 0, given(job_desc.pn_min_cpus) or 0)
	local mem = given(job_desc.min_mem_per_node)
	if mem == nil and given(job_desc.min_mem_per_cpu) ~= nil then
		mem = job_desc.min_mem_per_cpu * cpus
	end
	return cpus, mem or 0
end

-- Why no node could ever hold this offline job (its GPUs, CPUs and memory
-- on one node), or nil: Slurm no longer sees its GPU request, so its own
-- check at submit does not cover it.
local function never_placeable(job_desc, gpus)
	local shapes = cluster_shapes()
	if shapes == nil then
		return nil
	end
	local cpus, mem = offline_room(job_desc)
	local have = {}
	for i, s in ipairs(shapes) do
		if gpus <= s.gpus and cpus <= s.cpus and mem <= s.mem_mib then
			return nil
		end
		if i <= 4 then
			table.insert(have, string.format("%d GPUs, %d CPUs and %d MiB", s.gpus, s.cpus, s.mem_mib))
		end
	end
	return string.format(
		"no node of this cluster can ever hold this offline job: it asks for %d GPU(s), %d CPU(s) and %d MiB "
			.. "on one node (an offline job runs on one node), and the GPU nodes offer at most %s. "
			.. "Ask for less (--gres=gpu:N, -c, -n, --mem), or submit without --muxflow",
		gpus,
		cpus,
		mem,
		table.concat(have, "; or ")
	)
end

-- Fields of a job that slurmctld prints in `scontrol show job`, where a
-- line break (or another control character) would imitate Slurm's own
-- lines, which the muxflow Prolog reads (its placement, its offline slots).
local TEXT_FIELDS = { "name", "comment", "work_dir", "std_in", "std_out", "std_err" }
local TEXT_OPTIONS = {
	name = "--job-name",
	comment = "--comment",
	work_dir = "--chdir",
	std_in = "--input",
	std_out = "--output",
	std_err = "--error",
}

-- The first field of job_desc with a control character (a byte below 0x20,
-- or DEL), and the character's code; nil when none has.
local function control_character_field(job_desc)
	for _, field in ipairs(TEXT_FIELDS) do
		local v = job_desc[field]
		if type(v) == "string" then
			local at = string.find(v, "[%c]")
			if at ~= nil then
				return field, string.byte(v, at)
			end
		end
	end
	return nil
end

local function control_character_refusal(field, code)
	return string.format(
		"the job's %s (%s) holds a control character (code %d, e.g. a line break): muxflow jobs' names, comments "
			.. "and paths must be printable, since the node reads the job as slurmctld prints it. "
			.. "Rename it or choose another path",
		field,
		TEXT_OPTIONS[field] or field,
		code
	)
end

-- The batch script's path (sbatch's script argument; salloc's or srun's
-- command), which slurmctld prints as `Command=` in `scontrol show job`,
-- a line the node reads like the fields above. Slurm hands job_submit the
-- command line as job_desc.argv (the path first; the table's first index
-- has been 0). Returns the character's code; nil when the path has none.
local function control_character_in_command(job_desc)
	local argv = job_desc.argv
	if type(argv) ~= "table" then
		return nil
	end
	local path = argv[0] or argv[1]
	if type(path) ~= "string" then
		return nil
	end
	local at = string.find(path, "[%c]")
	if at == nil then
		return nil
	end
	return string.byte(path, at)
end

local function command_refusal(code)
	return string.format(
		"the job's batch script path (Command=, the script given to sbatch) holds a control character "
			.. "(code %d, e.g. a line break in a directory's or the file's name): muxflow jobs' paths must be "
			.. "printable, since the node reads the job as slurmctld prints it. Rename the directory or script, "
			.. "or copy the script to a path without one and submit that",
		code
	)
end

-- Drops every gres:gpu request from a tres_per_node string: an offline job
-- takes an offline slot, never a whole GPU.
local function without_gpu(tres)
	if tres == nil or tres == "" then
		return nil
	end
	local kept = {}
	for item in string.gmatch(tres, "[^,]+") do
		if not string.match(item, "^gres:gpu") and not string.match(item, "^gres:" .. OFFLINE_GRES) then
			table.insert(kept, item)
		end
	end
	if #kept == 0 then
		return nil
	end
	return table.concat(kept, ",")
end

function muxflow_job_submit(job_desc)
	local mode = muxflow_mode(job_desc)
	if mode ~= MODE_OFFLINE then
		local field, value = offline_slot_request(job_desc)
		if field ~= nil then
			slurm.log_user(
				"muxflow: the offline slot '%s' (%s=%s) is placed by muxflow only: submit with --muxflow=offline, "
					.. "or ask for a whole GPU with --gres=gpu:1",
				OFFLINE_GRES,
				field,
				value
			)
			return slurm.ERROR
		end
	end
	if mode == nil then
		return slurm.SUCCESS
	end
	local field, code = control_character_field(job_desc)
	if field ~= nil then
		slurm.log_user("muxflow: %s", control_character_refusal(field, code))
		return slurm.ERROR
	end
	local command_code = control_character_in_command(job_desc)
	if command_code ~= nil then
		slurm.log_user("muxflow: %s", command_refusal(command_code))
		return slurm.ERROR
	end
	if mode == MODE_OFFLINE then
		local why = offline_refusal(job_desc)
		if why ~= nil then
			slurm.log_user("muxflow: %s", why)
			return slurm.ERROR
		end
		-- Read before the GPU request is dropped below.
		local gpus = offline_gpus(job_desc)
		local asked = gpus_asked(job_desc)
		local never = never_placeable(job_desc, gpus)
		if never ~= nil then
			slurm.log_user("muxflow: %s", never)
			return slurm.ERROR
		end
		local others = without_gpu(job_desc.tres_per_node)
		if PARK_OFFLINE then
			-- Slurm's Lua binding takes strings only: "" clears the request.
			job_desc.tres_per_node = others or ""
			job_desc.priority = 0
		else
			local slot = "gres:" .. OFFLINE_GRES .. ":1"
			job_desc.tres_per_node = others and (others .. "," .. slot) or slot
		end
		-- Offline work takes the slot only: no other GRES request in any field.
		for _, field in ipairs({ "tres_per_job", "tres_per_socket", "tres_per_task" }) do
			if job_desc[field] ~= nil and job_desc[field] ~= "" then
				job_desc[field] = without_gpu(job_desc[field]) or ""
			end
		end
		-- Parked: no placement yet; the matcher writes `placed=<node>:g<i>`
		-- (a k-GPU job: `gpus=k placed=<node>:g<i>,g<j>,...`, its gang).
		-- Without a matcher, Slurm picks the slot.
		if gpus > 1 and not PARK_OFFLINE then
			slurm.log_user(
				"muxflow: --muxflow=offline with %d GPUs needs muxflow-matcher, which this cluster does not run "
					.. "(PARK_OFFLINE = false): ask for one GPU",
				gpus
			)
			return slurm.ERROR
		end
		-- Said at submit, where the user looks first: the GPU count they get
		-- when they named none, and that the hold Slurm shows is muxflow's.
		if asked == 0 then
			slurm.log_user("muxflow: no GPU requested: this offline job gets one GPU (ask for more with --gres=gpu:N)")
		end
		if PARK_OFFLINE then
			slurm.log_user(
				"muxflow: held by muxflow until it places the job on a GPU (squeue shows JobHeldUser, then "
					.. "JobHeldAdmin; you cannot release it and need not). Why it waits: muxflow-report <jobid>, "
					.. "or squeue -O JobID,Reason,Comment"
			)
			-- The reason column shows Slurm's words only; Comment (squeue -O
			-- Comment, scontrol show job) is the one field a user looks at
			-- that muxflow may write for a pending job. A user's own comment
			-- is kept: the matcher writes only over muxflow's.
			if job_desc.comment == nil or job_desc.comment == "" then
				job_desc.comment = COMMENT_PREFIX .. "held until placed on a GPU"
			end
		end
		job_desc.admin_comment = TAG
			.. " " .. KEY_MODE .. "=" .. MODE_OFFLINE
			.. (gpus > 1 and (" " .. KEY_GPUS .. "=" .. gpus) or "")
			.. (PARK_OFFLINE and "" or (" " .. KEY_PLACED .. "=" .. PLACED_ANY))
	elseif mode == MODE_ONLINE then
		-- An explicit zero (--gres=gpu:0, --gpus=0) leaves an online job no
		-- GPU to own: nothing would be protected and nothing shared.
		if names_gpus(job_desc) and gpus_asked(job_desc) == 0 then
			slurm.log_user(
				"muxflow: --muxflow=online with zero GPUs (--gres=gpu:0 or --gpus=0): an online job owns the GPUs it "
					.. "serves on. Ask for them (--gres=gpu:1), or submit without --muxflow"
			)
			return slurm.ERROR
		end
		job_desc.admin_comment = TAG .. " " .. KEY_MODE .. "=" .. MODE_ONLINE
	else
		-- The plugin validates the value at submit; anything else was forged.
		slurm.log_user("muxflow: invalid MUXFLOW_MODE '%s' (accepted: online, offline)", mode)
		return slurm.ERROR
	end
	return slurm.SUCCESS
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	return muxflow_job_submit(job_desc)
end

-- Is the job a muxflow offline job? Its AdminComment says so (job_submit.lua
-- or the matcher wrote it; users cannot).
local function is_offline_job(job_rec)
	local c = job_rec.admin_comment
	return c ~= nil and string.match(c, "^" .. TAG .. " " .. KEY_MODE .. "=" .. MODE_OFFLINE) ~= nil
end

-- Slurm's INFINITE (32-bit): job_desc.priority of `scontrol release`.
local INFINITE = 4294967295

-- Has the matcher placed the job (its placement in the AdminComment)?
local function placed(job_rec)
	local c = job_rec.admin_comment
	return c ~= nil and string.match(c, " " .. KEY_PLACED .. "=[^ ]") ~= nil
end

local function denied(job_rec, modify_uid, what)
	-- 22.05 discards log_user in job_modify (bug 14539): the log keeps the reason.
	slurm.log_info(
		"muxflow: job %s: uid %d may not %s: offline work is placed by muxflow-matcher only",
		tostring(job_rec.job_id),
		modify_uid,
		what
	)
	return slurm.ESLURM_ACCESS_DENIED
end

function muxflow_job_modify(job_desc, job_rec, modify_uid)
	if privileged(modify_uid) then
		return slurm.SUCCESS
	end
	local field = offline_slot_request(job_desc)
	if field ~= nil then
		return denied(job_rec, modify_uid, "request the offline slot (" .. field .. ")")
	end
	if not is_offline_job(job_rec) then
		return slurm.SUCCESS
	end
	local text_field = control_character_field(job_desc)
	if text_field ~= nil then
		return denied(job_rec, modify_uid, "put a control character in its " .. text_field)
	end
	for _, f in ipairs(TRES_FIELDS) do
		if job_desc[f] ~= nil then
			return denied(job_rec, modify_uid, "change its GRES (" .. f .. ")")
		end
	end
	for _, f in ipairs(PLACEMENT_FIELDS) do
		if job_desc[f] ~= nil then
			return denied(job_rec, modify_uid, "change where it runs (" .. f .. ")")
		end
	end
	-- Release is priority=INFINITE, hold priority=0; keeping one's job held is
	-- fine, and so is releasing one's own hold of a job muxflow placed (Slurm
	-- lets its owner release only a user-level hold; a job not yet placed is
	-- muxflow's to release).
	local p = job_desc.priority
	if p == INFINITE and placed(job_rec) then
		return slurm.SUCCESS
	end
	if p ~= nil and p ~= NO_VAL and p ~= 0 then
		return denied(job_rec, modify_uid, "release it or change its priority")
	end
	return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return muxflow_job_modify(job_desc, job_rec, modify_uid)
end

return slurm.SUCCESS
