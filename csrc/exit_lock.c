/*
 * glibc's exit-handler lock, made new in each fork child.
 *
 * __cxa_atexit (a C++ static's first use registers its destructor through it;
 * atexit and on_exit too) and __cxa_finalize take a private lock of glibc's,
 * __exit_funcs_lock, that fork() does not reset in the child (glibc 2.36 resets
 * its loader, malloc and stdio locks, not this one). A thread of the parent inside
 * __cxa_atexit at the fork leaves it held in the child for ever, and the child's
 * first static initialisation waits on it: seen in CI, a DataLoader worker's
 * torch.set_num_threads(1) (which builds torch's thread pool, a function-local
 * static) hung there while the parent's other threads ran their first tensor
 * operations, each registering its operator handles' destructors.
 *
 * The lock is hidden (not in libc's dynamic symbols), so it is found once per
 * process from the code of __cxa_atexit: on x86-64, its entry jumps (after an
 * optional endbr64) to __internal_atexit, which takes the lock with
 * `lea lock(%rip), %reg` then `lock cmpxchg %r32, (%reg)`, or with a RIP-relative
 * `lock cmpxchg`. The address is kept only if it lies in a writable segment of
 * libc and holds a lock value (0, 1 or 2); elsewhere (another architecture or C
 * library, a changed code layout) nothing is found and nothing is reset.
 *
 * In a fork child only the forking thread exists, and it is never inside the
 * lock (glibc's own exit paths release it around each handler they call), so a
 * held lock there belongs to a thread that is gone: the child handler stores 0.
 * What the gone thread was doing is harmless to leave: __internal_atexit fills a
 * slot after reserving it, and a reserved slot not yet filled (ef_us) is skipped
 * when exit handlers run; __cxa_finalize only reads and marks slots.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <string.h>

#include "exit_lock.h"

static volatile int *exit_lock = NULL;  /* written once, before the child handler is registered */
static int held_at_fork = 0;            /* in a child: the lock was held when it was forked */

#if defined(__x86_64__) && defined(__GLIBC__)

/* How far into __internal_atexit the lock is taken (0x2a bytes in glibc 2.36). */
#define SCAN_BYTES 160

static int32_t read_i32(const unsigned char *p) {
    int32_t value;
    memcpy(&value, p, sizeof value);
    return value;
}

/* The lock's address in the code at `code`, or NULL. A byte scan, not a decoder:
 * a match must pair a lea with the lock cmpxchg using its register (or be a
 * RIP-relative lock cmpxchg), and the caller checks where the address lies. */
static uintptr_t find_in_code(const unsigned char *code) {
    static const unsigned char endbr64[] = {0xf3, 0x0f, 0x1e, 0xfa};
    uintptr_t lea_target[16] = {0};
    if (memcmp(code, endbr64, sizeof endbr64) == 0) code += sizeof endbr64;
    if (code[0] == 0xe9) code += 5 + read_i32(code + 1); /* jmp rel32: __cxa_atexit's tail call */
    for (const unsigned char *p = code; p < code + SCAN_BYTES; p++) {
        /* lea disp32(%rip), %reg: REX.W (+R) 8d, mod 00 rm 101 */
        if ((p[0] & 0xfb) == 0x48 && p[1] == 0x8d && (p[2] & 0xc7) == 0x05) {
            int reg = ((p[2] >> 3) & 7) | ((p[0] & 4) ? 8 : 0);
            lea_target[reg] = (uintptr_t)(p + 7) + (intptr_t)read_i32(p + 3);
            continue;
        }
        if (p[0] != 0xf0) continue; /* lock prefix */
        const unsigned char *op = p + 1;
        int rex_b = 0;
        if ((op[0] & 0xf0) == 0x40) { /* REX */
            rex_b = op[0] & 1;
            op++;
        }
        if (op[0] != 0x0f || op[1] != 0xb1) continue; /* cmpxchg r32, r/m32 */
        unsigned char modrm = op[2];
        if ((modrm & 0xc7) == 0x05) return (uintptr_t)(op + 7) + (intptr_t)read_i32(op + 3);
        int base = (modrm & 7) | (rex_b ? 8 : 0);
        if ((modrm & 0xc0) == 0 && (modrm & 7) != 4 && (modrm & 7) != 5 && lea_target[base])
            return lea_target[base];
    }
    return 0;
}

struct writable_check {
    uintptr_t code, address;
    int found;
};

/* Whether the address lies in a writable loaded segment of the object holding the code. */
static int in_writable_segment(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct writable_check *check = data;
    int holds_code = 0, holds_address = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t start = info->dlpi_addr + ph->p_vaddr, end = start + ph->p_memsz;
        if (check->code >= start && check->code < end) holds_code = 1;
        if ((ph->p_flags & PF_W) && check->address >= start && check->address + sizeof(int) <= end)
            holds_address = 1;
    }
    if (!holds_code) return 0;
    check->found = holds_address;
    return 1; /* the object holding the code was seen: stop */
}

static volatile int *find_exit_lock(void) {
    void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    if (libc == NULL) return NULL;
    /* libc's own, not an interposer's: through its handle, not RTLD_DEFAULT */
    void *cxa_atexit = dlsym(libc, "__cxa_atexit");
    dlclose(libc);
    if (cxa_atexit == NULL) return NULL;
    struct writable_check check = {(uintptr_t)cxa_atexit, find_in_code(cxa_atexit), 0};
    if (check.address == 0 || check.address % sizeof(int) != 0) return NULL;
    dl_iterate_phdr(in_writable_segment, &check);
    if (!check.found) return NULL;
    volatile int *lock = (volatile int *)check.address;
    int value = *lock;
    return value >= 0 && value <= 2 ? lock : NULL;
}

#else

static volatile int *find_exit_lock(void) { return NULL; }

#endif

void sl_exit_lock_find(void) { exit_lock = find_exit_lock(); }

void sl_exit_lock_on_child(void) {
    held_at_fork = exit_lock != NULL && *exit_lock != 0;
    if (held_at_fork) *exit_lock = 0;
}

PyObject *sl_exit_handler_lock(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    return Py_BuildValue("(KO)", (unsigned long long)(uintptr_t)exit_lock, held_at_fork ? Py_True : Py_False);
}
