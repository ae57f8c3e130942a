/*
 * A dev-cluster fixture, not part of muxflow: a SPANK plugin that puts each
 * step's slurmstepd and tasks into real cgroup v2 directories laid out as
 * Slurm's cgroup/v2 plugin lays them out (cgroup_v2.c, cgroup_p_step_create):
 *
 *   <cgroups>/<node>/system.slice/slurmstepd.scope/<job dir>/step_<step>/slurm
 *   <cgroups>/<node>/system.slice/slurmstepd.scope/<job dir>/step_<step>/user/task_<i>
 *
 * The dev nodes' slurmd runs without a cgroup plugin (several slurmd on one
 * host, some chrooted), so without this no process of a job would be in a
 * job cgroup. scripts/devcluster builds it against the release's headers,
 * lists it first in plugstack.conf, starts each slurmd in <cgroups>/<node>
 * (MUXFLOW_DEV_NODE=<node> in its environment, inherited by slurmstepd)
 * under a cgroup namespace rooted there, and has the Prolog make the job
 * directory, named as the release names it, and write that name to
 * <names>/<node>/<job id>.
 *
 * Plugstack arguments: cgroups=<dir> names=<dir>. Every failure is logged
 * and ignored: the job then runs outside a job cgroup, as it did before.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(muxflow_devcgroup, 1);

static char cgroups[1024], names[1024];
/* The step's directory, once slurmstepd is in it. */
static char step_dir[4096];

static void mkdirs(const char *path)
{
	char buf[4096];
	snprintf(buf, sizeof(buf), "%s", path);
	for (char *p = buf + 1; *p; p++) {
		if (*p == '/') {
			*p = '\0';
			mkdir(buf, 0755);
			*p = '/';
		}
	}
	mkdir(buf, 0755);
}

/* Moves process pid into cgroup dir (made first). */
static int place(const char *dir, pid_t pid)
{
	char procs[4200];
	int fd, rc = 0;
	mkdirs(dir);
	snprintf(procs, sizeof(procs), "%s/cgroup.procs", dir);
	fd = open(procs, O_WRONLY);
	if (fd < 0 || dprintf(fd, "%d\n", (int) pid) < 0) {
		slurm_error("muxflow_devcgroup: %s: %s", procs, strerror(errno));
		rc = -1;
	}
	if (fd >= 0)
		close(fd);
	return rc;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	const char *node = getenv("MUXFLOW_DEV_NODE");
	uint32_t job, step;
	char map[2048], job_dir[256] = "", step_name[32];
	FILE *f;

	if (!spank_remote(sp) || !node)
		return 0;
	for (int i = 0; i < ac; i++) {
		if (!strncmp(av[i], "cgroups=", 8))
			snprintf(cgroups, sizeof(cgroups), "%s", av[i] + 8);
		else if (!strncmp(av[i], "names=", 6))
			snprintf(names, sizeof(names), "%s", av[i] + 6);
	}
	if (!cgroups[0] || !names[0] ||
	    spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS)
		return 0;
	/* The Prolog's name for the job directory; none: no job cgroup. */
	snprintf(map, sizeof(map), "%s/%s/%u", names, node, job);
	if (!(f = fopen(map, "r")))
		return 0;
	if (!fgets(job_dir, sizeof(job_dir), f))
		job_dir[0] = '\0';
	fclose(f);
	job_dir[strcspn(job_dir, "\n")] = '\0';
	if (!job_dir[0] || strchr(job_dir, '/'))
		return 0;
	if (step == SLURM_BATCH_SCRIPT)
		snprintf(step_name, sizeof(step_name), "batch");
	else if (step == SLURM_EXTERN_CONT)
		snprintf(step_name, sizeof(step_name), "extern");
	else if (step == SLURM_INTERACTIVE_STEP)
		snprintf(step_name, sizeof(step_name), "interactive");
	else
		snprintf(step_name, sizeof(step_name), "%u", step);
	snprintf(step_dir, sizeof(step_dir),
		 "%s/%s/system.slice/slurmstepd.scope/%s/step_%s", cgroups,
		 node, job_dir, step_name);
	char slurm_dir[4200];
	snprintf(slurm_dir, sizeof(slurm_dir), "%s/slurm", step_dir);
	if (place(slurm_dir, getpid()))
		step_dir[0] = '\0';
	return 0;
}

/* In each task's process, before it runs the user's program. */
int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	int task;
	char dir[4200];

	if (!step_dir[0] ||
	    spank_get_item(sp, S_TASK_ID, &task) != ESPANK_SUCCESS)
		return 0;
	snprintf(dir, sizeof(dir), "%s/user/task_%d", step_dir, task);
	place(dir, getpid());
	return 0;
}
