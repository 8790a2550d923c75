/*
 * psyche authorizer: permissions for permissioned runs (the Psyche book's authorizer).
 *
 * A grantor (a run's join authority) grants an authorization to a grantee; the grantee names delegate
 * keys (e.g. the hot keys of its machines); the coordinator program lets the grantee and its delegates
 * join runs whose join authority is the grantor. Revoking closes the authorization.
 *
 * Authorization account: program address of ["authorization", grantor, grantee]; layout `Authorization`.
 * A grantee of all zeros authorizes anyone (the grantor's open invitation).
 */
#include "../include/sbpf.h"

/* MAX_DELEGATES, AUTH_MAGIC, the error codes and `Authorization` come from the layout table
 * (src/core/layout/layout-table.ts), generated into ../include/psyche_layout.h. */
#include "../include/psyche_layout.h"

enum { IX_GRANT = 0, IX_DELEGATES, IX_REVOKE };

static u64 fail(u64 code, const char *why) {
  log(why);
  return code;
}

/* accounts: grantor (signer, writable: pays), authorization PDA (writable), system program.
 * data: grantee [32], lamports u64 (rent exemption of 600 bytes) */
static u64 grant(Input *in, const u8 *d, u64 len) {
  if (in->account_count < 3 || len != 40) return fail(E_INVALID_INSTRUCTION, "grant: expected grantor, authorization, system program; grantee and lamports");
  SolAccountInfo *grantor = &in->accounts[0], *auth = &in->accounts[1];
  if (!grantor->is_signer) return fail(E_MISSING_SIGNATURE, "the grantor must sign");
  SolSignerSeed seeds[4] = {{(const u8 *)"authorization", 13}, {grantor->key, 32}, {d, 32}, {NULL, 1}};
  u8 address[32], bump;
  if (sol_try_find_program_address(seeds, 3, in->program_id, address, &bump)) return fail(E_WRONG_PROGRAM_ADDRESS, "no program address");
  if (!equal(address, auth->key, 32)) return fail(E_WRONG_PROGRAM_ADDRESS, "the authorization account is not the program address of (grantor, grantee)");
  if (equal(auth->owner, in->program_id, 32)) return fail(E_ALREADY_EXISTS, "this grantor already granted an authorization to this grantee");
  if (!grantor->is_writable || !auth->is_writable) return fail(E_NOT_WRITABLE, "the grantor and the authorization must be writable");
  seeds[3].addr = &bump;
  SolSignerSeeds signer = {seeds, 4};
  Create c = {grantor, auth, read_u64(d + 32), sizeof(Authorization), &signer};
  u64 e = create_account(in, &c);
  if (e) return e;
  Authorization *a = (Authorization *)auth->data;
  a->magic = AUTH_MAGIC;
  copy(a->grantor, grantor->key, 32);
  copy(a->grantee, d, 32);
  a->active = 1;
  return 0;
}

static u64 load(Input *in, Authorization **out) {
  if (in->account_count < 2) return fail(E_INVALID_INSTRUCTION, "expected a signer and the authorization account");
  SolAccountInfo *a = &in->accounts[1];
  if (!equal(a->owner, in->program_id, 32) || a->data_len != sizeof(Authorization) || ((Authorization *)a->data)->magic != AUTH_MAGIC)
    return fail(E_WRONG_ACCOUNT, "not an authorization of this program");
  if (!a->is_writable) return fail(E_NOT_WRITABLE, "the authorization account must be writable");
  if (!in->accounts[0].is_signer) return fail(E_MISSING_SIGNATURE, "the first account must sign");
  *out = (Authorization *)a->data;
  return 0;
}

u64 entrypoint(const u8 *input) {
  Input in;
  if (deserialize(input, &in)) return fail(E_INVALID_INSTRUCTION, "too many accounts");
  if (in.data_len < 1) return fail(E_INVALID_INSTRUCTION, "empty instruction");
  const u8 *d = in.data + 1;
  u64 len = in.data_len - 1;
  if (in.data[0] == IX_GRANT) return grant(&in, d, len);
  Authorization *a;
  u64 e = load(&in, &a);
  if (e) return e;
  const u8 *signer = in.accounts[0].key;
  switch (in.data[0]) {
    case IX_DELEGATES: {
      /* accounts: grantee (signer), authorization. data: count u8, keys: replaces the delegate list */
      if (!equal(signer, a->grantee, 32)) return fail(E_UNAUTHORIZED, "only the grantee sets delegates");
      if (len < 1 || len != 1 + 32 * (u64)d[0]) return fail(E_INVALID_INSTRUCTION, "delegates: expected count and keys");
      if (d[0] > MAX_DELEGATES) return fail(E_CAPACITY_EXCEEDED, "at most MAX_DELEGATES = 16 delegates");
      zero(a->delegates, sizeof(a->delegates));
      copy(a->delegates, d + 1, 32 * (u64)d[0]);
      a->delegates_len = d[0];
      return 0;
    }
    case IX_REVOKE: {
      /* accounts: grantor (signer), authorization, recipient (writable). Closes the authorization. */
      if (!equal(signer, a->grantor, 32)) return fail(E_UNAUTHORIZED, "only the grantor revokes");
      if (in.account_count < 3 || !in.accounts[2].is_writable) return fail(E_INVALID_INSTRUCTION, "revoke: expected a writable recipient");
      SolAccountInfo *auth = &in.accounts[1], *to = &in.accounts[2];
      *to->lamports += *auth->lamports;
      *auth->lamports = 0;
      zero(auth->data, auth->data_len);
      return 0;
    }
    default:
      return fail(E_INVALID_INSTRUCTION, "unknown instruction");
  }
}
