/* The few pieces of the Solana C ABI this program uses: syscalls (resolved by the loader by name),
 * the serialized input of the aligned BPF loaders, and cross-program invocation structures. */
#ifndef PSYCHE_SBPF_H
#define PSYCHE_SBPF_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define NULL ((void *)0)

typedef struct {
  const u8 *addr;
  u64 len;
} SolBytes;

/* Account as the C SDK lays it out for sol_invoke_signed_c. */
typedef struct {
  u8 *key;
  u64 *lamports;
  u64 data_len;
  u8 *data;
  u8 *owner;
  u64 rent_epoch;
  u8 is_signer;
  u8 is_writable;
  u8 executable;
} SolAccountInfo;

typedef struct {
  u8 *pubkey;
  u8 is_writable;
  u8 is_signer;
} SolAccountMeta;

typedef struct {
  u8 *program_id;
  SolAccountMeta *accounts;
  u64 account_len;
  u8 *data;
  u64 data_len;
} SolInstruction;

typedef struct {
  const u8 *addr;
  u64 len;
} SolSignerSeed;

typedef struct {
  const SolSignerSeed *addr;
  u64 len;
} SolSignerSeeds;

typedef struct {
  u64 slot;
  i64 epoch_start_timestamp;
  u64 epoch;
  u64 leader_schedule_epoch;
  i64 unix_timestamp;
} SolClock;

extern void sol_log_(const char *message, u64 len);
extern void sol_log_64_(u64 a, u64 b, u64 c, u64 d, u64 e);
extern void sol_log_pubkey(const u8 *key);
extern void sol_log_data(const SolBytes *data, u64 count);
extern u64 sol_sha256(const SolBytes *bytes, u64 count, u8 *out);
extern u64 sol_try_find_program_address(const SolSignerSeed *seeds, u64 count, const u8 *program_id, u8 *address, u8 *bump);
extern u64 sol_invoke_signed_c(const SolInstruction *ix, const SolAccountInfo *infos, u64 info_count, const SolSignerSeeds *seeds, u64 seeds_count);
extern u64 sol_get_clock_sysvar(SolClock *clock);
extern void sol_memcpy_(void *dst, const void *src, u64 n);
extern void sol_memset_(void *dst, u8 value, u64 n);
extern int sol_memcmp_(const void *a, const void *b, u64 n, int *result);

#define MAX_PERMITTED_DATA_INCREASE 10240
#define MAX_ACCOUNTS 8

typedef struct {
  SolAccountInfo accounts[MAX_ACCOUNTS];
  u64 account_count;
  const u8 *data;
  u64 data_len;
  const u8 *program_id;
} Input;

static inline u64 deserialize(const u8 *input, Input *out) {
  u64 n = *(const u64 *)input;
  input += 8;
  if (n > MAX_ACCOUNTS) return 1;
  for (u64 i = 0; i < n; i++) {
    u8 dup = *input;
    if (dup != 0xff) {
      out->accounts[i] = out->accounts[dup];
      input += 8;
      continue;
    }
    SolAccountInfo *a = &out->accounts[i];
    a->is_signer = input[1];
    a->is_writable = input[2];
    a->executable = input[3];
    input += 8;
    a->key = (u8 *)input;
    input += 32;
    a->owner = (u8 *)input;
    input += 32;
    a->lamports = (u64 *)input;
    input += 8;
    a->data_len = *(const u64 *)input;
    input += 8;
    a->data = (u8 *)input;
    input += a->data_len + MAX_PERMITTED_DATA_INCREASE;
    input = (const u8 *)(((u64)input + 7) & ~(u64)7);
    a->rent_epoch = *(const u64 *)input;
    input += 8;
  }
  out->account_count = n;
  out->data_len = *(const u64 *)input;
  input += 8;
  out->data = input;
  input += out->data_len;
  out->program_id = input;
  return 0;
}

static inline void copy(void *dst, const void *src, u64 n) {
  if (n) sol_memcpy_(dst, src, n);
}

static inline void zero(void *dst, u64 n) {
  if (n) sol_memset_(dst, 0, n);
}

static inline int equal(const void *a, const void *b, u64 n) {
  int r = 0;
  sol_memcmp_(a, b, n, &r);
  return r == 0;
}

static inline void log(const char *message) {
  u64 n = 0;
  while (message[n]) n++;
  sol_log_(message, n);
}

static inline void sha256_2(const u8 *a, u64 alen, const u8 *b, u64 blen, u8 *out) {
  SolBytes parts[2] = {{a, alen}, {b, blen}};
  sol_sha256(parts, blen ? 2 : 1, out);
}

static inline u64 read_u64(const u8 *p) {
  u64 v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static inline u32 read_u32(const u8 *p) {
  return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

static inline void write_u64(u8 *p, u64 v) {
  for (int i = 0; i < 8; i++) p[i] = (u8)(v >> (8 * i));
}

static const u8 SYSTEM_PROGRAM[32] = {0};

/* A program-address account to create for the calling program. */
typedef struct {
  SolAccountInfo *payer;         /* signer, writable: pays what the account lacks */
  SolAccountInfo *account;       /* the program address (writable) */
  u64 lamports;                  /* what the account must hold (rent exemption of `space`) */
  u64 space;                     /* its data length */
  const SolSignerSeeds *signer;  /* the account's seeds with its bump */
} Create;

static inline u64 system_call(Input *in, const Create *c, const u8 *data, u64 len, u8 payer_too) {
  SolAccountMeta metas[2] = {{c->payer->key, 1, 1}, {c->account->key, 1, 1}};
  SolInstruction ix = {(u8 *)SYSTEM_PROGRAM, payer_too ? metas : metas + 1, payer_too ? 2 : 1, (u8 *)data, len};
  return sol_invoke_signed_c(&ix, in->accounts, in->account_count, c->signer, 1);
}

/*
 * Creates the account without being blocked by anyone who sent lamports to its address first: the system
 * program's CreateAccount refuses an address that holds lamports ("already in use"), so such an account gets
 * the shortfall transferred, then Allocate and Assign, which only the program address's own signature may do.
 * `owner`: the program the account is assigned to (the calling program, or e.g. the token program for a token account).
 */
static inline u64 create_account_owned(Input *in, const Create *c, const u8 *owner) {
  u8 data[52];
  u64 held = *c->account->lamports;
  u64 e;
  if (held == 0) {
    zero(data, 4); /* SystemInstruction::CreateAccount: lamports, space, owner */
    write_u64(data + 4, c->lamports);
    write_u64(data + 12, c->space);
    copy(data + 20, owner, 32);
    return system_call(in, c, data, 52, 1);
  }
  if (held < c->lamports) {
    zero(data, 4);
    data[0] = 2; /* Transfer: lamports */
    write_u64(data + 4, c->lamports - held);
    SolAccountMeta metas[2] = {{c->payer->key, 1, 1}, {c->account->key, 1, 0}};
    SolInstruction ix = {(u8 *)SYSTEM_PROGRAM, metas, 2, data, 12};
    if ((e = sol_invoke_signed_c(&ix, in->accounts, in->account_count, c->signer, 1))) return e;
  }
  zero(data, 4);
  data[0] = 8; /* Allocate: space */
  write_u64(data + 4, c->space);
  if ((e = system_call(in, c, data, 12, 0))) return e;
  zero(data, 4);
  data[0] = 1; /* Assign: owner */
  copy(data + 4, owner, 32);
  return system_call(in, c, data, 36, 0);
}

/* The same, for an account the calling program owns. */
static inline u64 create_account(Input *in, const Create *c) {
  return create_account_owned(in, c, in->program_id);
}

#endif
