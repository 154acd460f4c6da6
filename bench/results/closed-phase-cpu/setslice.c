#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
struct sched_attr { uint32_t size, sched_policy; uint64_t sched_flags; int32_t sched_nice; uint32_t sched_priority; uint64_t sched_runtime, sched_deadline, sched_period; uint32_t util_min, util_max; };
int main(int c, char **v) {
  struct sched_attr a; memset(&a,0,sizeof a); a.size=sizeof a; a.sched_policy=0; a.sched_nice=atoi(v[3]); a.sched_runtime=(uint64_t)atoll(v[2])*1000;
  if (syscall(SYS_sched_setattr, atoi(v[1]), &a, 0)) { perror("sched_setattr"); return 1; }
  return 0; }
