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
           no slot yet — until muxflow-matcher places it:
             scontrol update JobId=N ReqNodeList=<node> Gres=mfslot:g<i>:1
             scontrol release N
           Slurm 22.05 rejects at submit a constraint no node has, cannot turn
           an untyped GRES request into a typed one later, and keeps the old
           typed request when a typed one is rewritten: so the slot is written
           once, by the matcher, while the job is held. An offline job the
           user releases unplaced holds no GPU, and the plugin stops its tasks
           with a message saying so.
  online   The job keeps its gres/gpu request and is tagged in AdminComment so
           the matcher finds it.

Without a running matcher, parked offline jobs wait. Set PARK_OFFLINE = false
below as the fallback: offline jobs then ask for any offline slot (untyped
mfslot:1) and Slurm starts them on any free one (any GPU, whether or not an
online job runs there; the node health checks still pause offline work on
GPUs that are not healthy).
]]

-- Keep in step with muxflow.toml [slurm] offline_gres.
local OFFLINE_GRES = "mfslot"
local PARK_OFFLINE = true
local TAG = "muxflow:v1"

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
	if mode == nil then
		return slurm.SUCCESS
	end
	if mode == "offline" then
		local others = without_gpu(job_desc.tres_per_node)
		if PARK_OFFLINE then
			-- Slurm's Lua binding takes strings only: "" clears the request.
			job_desc.tres_per_node = others or ""
			job_desc.priority = 0
		else
			local slot = "gres:" .. OFFLINE_GRES .. ":1"
			job_desc.tres_per_node = others and (others .. "," .. slot) or slot
		end
		job_desc.admin_comment = TAG .. " mode=offline"
	elseif mode == "online" then
		job_desc.admin_comment = TAG .. " mode=online"
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

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return slurm.SUCCESS
end

return slurm.SUCCESS
