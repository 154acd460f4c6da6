/*
 * Installing a far page with UFFDIO_MOVE instead of UFFDIO_COPY (2026-11-28, issue 11).
 *
 * An app thread reads NPAGES pages of a userfaultfd-registered region (MISSING mode, no huge
 * pages) in a random order and times each read; a handler thread installs each faulting page.
 *   mode 0 (copy): the handler writes the page's contents into a 4 KiB buffer (standing for the
 *     decode) and installs it with UFFDIO_COPY: the kernel allocates a page and copies.
 *   mode 1 (move): the handler writes the contents straight into a page of a staging mapping
 *     (anonymous, pre-populated 512 pages at a time with MADV_POPULATE_WRITE, counted inline)
 *     and moves it into place with UFFDIO_MOVE: no kernel copy, no allocation on the fault.
 * Every read checks the word it got. Usage: install_move MODE NPAGES HANDLER_CPU APP_CPU.
 * Debian's headers (6.1) lack UFFDIO_MOVE: its struct and number are defined here (6.8 ABI).
 */
#define _GNU_SOURCE
#include <linux/userfaultfd.h>
#include <sys/syscall.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <pthread.h>
#include <sched.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

struct uffdio_move_ { uint64_t dst, src, len, mode; int64_t move; };
#define UFFDIO_MOVE_ _IOWR(UFFDIO, 0x05, struct uffdio_move_)
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define PG 4096UL
static int uffd; static char *region; static size_t npages; static int mode; static int hcpu, acpu;
static char *staging; static size_t stage_n = 512, stage_i = 512;
static double ioctl_ns, fill_ns, pop_ns; static long nserved;
static inline uint64_t now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000ull+t.tv_nsec;}
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
static char *buf;
static void *handler(void*a){
  if(hcpu>=0)pin(hcpu);
  struct pollfd p={uffd,POLLIN,0};
  for(;;){
    poll(&p,1,-1);
    struct uffd_msg m; if(read(uffd,&m,sizeof m)!=sizeof m)continue;
    if(m.event!=UFFD_EVENT_PAGEFAULT)continue;
    uint64_t addr=m.arg.pagefault.address&~(PG-1);
    if(addr==(uint64_t)region+npages*PG) { struct uffdio_zeropage z={{addr,PG},0,0}; ioctl(uffd,UFFDIO_ZEROPAGE,&z); return 0;}
    uint64_t t0=now();
    if(mode==0){
      for(size_t i=0;i<PG;i+=8)*(uint64_t*)(buf+i)=addr+i;
      uint64_t t1=now(); fill_ns+=t1-t0;
      struct uffdio_copy c={addr,(uint64_t)buf,PG,0,0};
      if(ioctl(uffd,UFFDIO_COPY,&c)){perror("copy");exit(1);}
      ioctl_ns+=now()-t1;
    } else {
      if(stage_i==stage_n){ uint64_t p0=now();
        if(madvise(staging,stage_n*PG,MADV_POPULATE_WRITE)){perror("populate");exit(1);} stage_i=0; pop_ns+=now()-p0; t0=now();}
      char *s=staging+stage_i*PG; stage_i++;
      for(size_t i=0;i<PG;i+=8)*(uint64_t*)(s+i)=addr+i;
      uint64_t t1=now(); fill_ns+=t1-t0;
      struct uffdio_move_ mv={addr,(uint64_t)s,PG,0,0};
      if(ioctl(uffd,UFFDIO_MOVE_,&mv)){perror("move");exit(1);}
      ioctl_ns+=now()-t1;
    }
    nserved++;
  }
}
static int cmp(const void*a,const void*b){uint64_t x=*(uint64_t*)a,y=*(uint64_t*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  mode=atoi(argv[1]); npages=atol(argv[2]); hcpu=atoi(argv[3]); acpu=atoi(argv[4]);
  uffd=syscall(SYS_userfaultfd,O_CLOEXEC);
  struct uffdio_api api={UFFD_API,(1ULL<<10)/*MOVE*/,0}; if(ioctl(uffd,UFFDIO_API,&api)){perror("api");return 1;}
  region=mmap(0,(npages+1)*PG,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  madvise(region,(npages+1)*PG,MADV_NOHUGEPAGE);
  struct uffdio_register r={{(uint64_t)region,(npages+1)*PG},UFFDIO_REGISTER_MODE_MISSING,0};
  if(ioctl(uffd,UFFDIO_REGISTER,&r)){perror("reg");return 1;}
  staging=mmap(0,stage_n*PG,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); madvise(staging,stage_n*PG,MADV_NOHUGEPAGE);
  buf=aligned_alloc(PG,PG); memset(buf,1,PG);
  pthread_t h; pthread_create(&h,0,handler,0);
  pin(acpu);
  size_t *ord=malloc(npages*sizeof*ord); for(size_t i=0;i<npages;i++)ord[i]=i;
  srand(7); for(size_t i=npages-1;i>0;i--){size_t j=rand()%(i+1);size_t t=ord[i];ord[i]=ord[j];ord[j]=t;}
  uint64_t *lat=malloc(npages*8); uint64_t sum=0; volatile uint64_t v;
  uint64_t T0=now();
  for(size_t i=0;i<npages;i++){uint64_t t=now(); v=*(volatile uint64_t*)(region+ord[i]*PG+8); lat[i]=now()-t; sum+=lat[i]; if(v!=(uint64_t)region+ord[i]*PG+8){fprintf(stderr,"bad\n");return 1;}}
  uint64_t T1=now();
  v=*(volatile uint64_t*)(region+npages*PG);
  pthread_join(h,0);
  qsort(lat,npages,8,cmp);
  printf("mode %s: faults/s %.0f mean %.2f p50 %.2f p99 %.2f p999 %.2f us | handler fill %.2f ioctl %.2f populate %.2f us/fault\n", mode?"move":"copy",
    npages*1e9/(T1-T0), sum/1e3/npages, lat[npages/2]/1e3, lat[npages*99/100]/1e3, lat[npages*999/1000]/1e3, fill_ns/1e3/nserved, ioctl_ns/1e3/nserved, pop_ns/1e3/nserved);
  return 0;
}
