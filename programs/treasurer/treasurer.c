/*
 * psyche treasurer: token rewards for a run's points (the Psyche book's treasurer, beside its coordinator).
 *
 * A run's main authority creates the run's treasury (init_treasury) for an SPL token mint and funds it (fund). A
 * client claims its points: the treasurer reads the points the client earned from the coordinator account's rewards
 * ledger (a read-only account of the coordinator program), and pays the points not yet claimed × the run's token rate
 * (set_rates) from the treasury's token account, by a CPI to the SPL token program signed with the treasury's program
 * address. What a client claimed lives in its participant record, so claiming twice pays once.
 *
 * Accounts of this program (layouts `Treasury`, `Participant` of the layout table):
 * - treasury: program address of ["treasury", coordinator]; it owns (as token owner) the vault,
 * - vault: the program address of ["vault", treasury], an SPL token account of the run's mint,
 * - participant: program address of ["participant", treasury, client].
 */
#include "../include/sbpf.h"

/* The layout (State, Points, Treasury, Participant), magics and error codes come from the layout table
 * (src/core/layout/layout-table.ts), generated into ../include/psyche_layout.h. */
#include "../include/psyche_layout.h"

#define STR_(x) #x
#define STR(x) STR_(x)

static const u8 TOKEN_PROGRAM[32] = {0x06, 0xdd, 0xf6, 0xe1, 0xd7, 0x65, 0xa1, 0x93, 0xd9, 0xcb, 0xe1, 0x46, 0xce, 0xeb, 0x79, 0xac,
                                     0x1c, 0xb4, 0x85, 0xed, 0x5f, 0x5b, 0x37, 0x91, 0x3a, 0x8c, 0xf5, 0x85, 0x7e, 0xff, 0x00, 0xa9};
#define TOKEN_ACCOUNT_SIZE 165 /* SPL token account: mint [32], owner [32], amount u64, ... */
#define MINT_SIZE 82           /* SPL mint: ..., is_initialized u8 at 45 */

static u64 fail(u64 code, const char *why) {
  log(why);
  return code;
}

/* The largest x with x × b < 2^64 (out of line: clang turns an inline check into a 128-bit multiply sBPF lacks). */
__attribute__((noinline)) static u64 max_factor(u64 b) {
  return (u64)-1 / b;
}

/* A coordinator account: its layout, magic and version (the header this program was built with). */
static u64 coordinator_state(const SolAccountInfo *a, const State **out) {
  const State *s = (const State *)a->data;
  if (a->data_len != sizeof(State) || s->magic != MAGIC || s->version != LAYOUT_VERSION)
    return fail(E_WRONG_ACCOUNT, "not a coordinator account (layout version " STR(LAYOUT_VERSION) ")");
  *out = s;
  return 0;
}

/* The treasury (accounts[2]) of this program, and its run's coordinator account (accounts[1]): the one it was created
 * for, still owned by the coordinator program that owned it then. */
static u64 load(Input *in, Treasury **t, const State **s) {
  SolAccountInfo *coord = &in->accounts[1], *treasury = &in->accounts[2];
  *t = (Treasury *)treasury->data;
  if (!equal(treasury->owner, in->program_id, 32) || treasury->data_len != sizeof(Treasury) || (*t)->magic != TREASURY_MAGIC)
    return fail(E_WRONG_ACCOUNT, "not a treasury of this program");
  if (!treasury->is_writable) return fail(E_NOT_WRITABLE, "the treasury must be writable");
  if (!equal(coord->key, (*t)->coordinator, 32)) return fail(E_WRONG_ACCOUNT, "the coordinator account is not the treasury's run");
  if (!equal(coord->owner, (*t)->coordinator_program, 32)) return fail(E_WRONG_ACCOUNT, "the coordinator account is not owned by the coordinator program");
  return coordinator_state(coord, s);
}

static u64 check_token_program(const SolAccountInfo *a) {
  return equal(a->key, TOKEN_PROGRAM, 32) ? 0 : fail(E_WRONG_ACCOUNT, "expected the SPL token program");
}

/* The vault of a treasury: its address, a token account of the treasury's mint whose token owner is the treasury. */
static u64 check_vault(const SolAccountInfo *vault, const Treasury *t, const u8 *treasury) {
  if (!equal(vault->key, t->vault, 32)) return fail(E_WRONG_ACCOUNT, "not the treasury's vault");
  if (!equal(vault->owner, TOKEN_PROGRAM, 32) || vault->data_len != TOKEN_ACCOUNT_SIZE || !equal(vault->data, t->mint, 32) || !equal(vault->data + 32, treasury, 32))
    return fail(E_WRONG_ACCOUNT, "the vault must be a token account of the treasury's mint owned by the treasury");
  if (!vault->is_writable) return fail(E_NOT_WRITABLE, "the vault must be writable");
  return 0;
}

/*
 * init_treasury (the run's main authority): creates the treasury of a run for an SPL token mint, and its vault.
 * accounts: authority (signer, writable: pays), coordinator, treasury (writable), vault (writable), mint, system
 * program, token program. data: lamports u64 (rent exemption of a Treasury), lamports u64 (of a token account)
 */
static u64 init_treasury(Input *in, const u8 *d, u64 len) {
  if (in->account_count < 7 || len != 16)
    return fail(E_INVALID_INSTRUCTION, "init_treasury: expected authority, coordinator, treasury, vault, mint, system program, token program; two rent amounts");
  SolAccountInfo *authority = &in->accounts[0], *coord = &in->accounts[1], *treasury = &in->accounts[2], *vault = &in->accounts[3], *mint = &in->accounts[4];
  if (!authority->is_signer) return fail(E_MISSING_SIGNATURE, "the run's main authority must sign");
  u64 e;
  if ((e = check_token_program(&in->accounts[6]))) return e;
  const State *s;
  if ((e = coordinator_state(coord, &s))) return e;
  if (s->run_id_len == 0 || s->run_id_len > RUN_ID_MAX) return fail(E_WRONG_ACCOUNT, "not a coordinator account: bad run id length");
  /* the coordinator account is its owner's program address of ["coordinator", run id]: only that program made it */
  SolSignerSeed cseeds[2] = {{(const u8 *)"coordinator", 11}, {s->run_id, s->run_id_len}};
  u8 address[32], bump;
  if (sol_try_find_program_address(cseeds, 2, coord->owner, address, &bump) || !equal(address, coord->key, 32))
    return fail(E_WRONG_ACCOUNT, "the coordinator account is not its owner program's address of [\"coordinator\", run id]");
  if (!equal(authority->key, s->main_authority, 32)) return fail(E_UNAUTHORIZED, "only the run's main authority creates its treasury");
  if (!equal(mint->owner, TOKEN_PROGRAM, 32) || mint->data_len != MINT_SIZE || mint->data[45] != 1) return fail(E_WRONG_ACCOUNT, "the mint must be an initialized SPL token mint");
  SolSignerSeed tseeds[3] = {{(const u8 *)"treasury", 8}, {coord->key, 32}, {NULL, 1}};
  if (sol_try_find_program_address(tseeds, 2, in->program_id, address, &bump)) return fail(E_WRONG_PROGRAM_ADDRESS, "no treasury address");
  if (!equal(address, treasury->key, 32)) return fail(E_WRONG_PROGRAM_ADDRESS, "the treasury is not the program address of [\"treasury\", coordinator]");
  if (equal(treasury->owner, in->program_id, 32)) return fail(E_ALREADY_EXISTS, "this run already has a treasury");
  u8 vbump;
  SolSignerSeed vseeds[3] = {{(const u8 *)"vault", 5}, {treasury->key, 32}, {NULL, 1}};
  if (sol_try_find_program_address(vseeds, 2, in->program_id, address, &vbump)) return fail(E_WRONG_PROGRAM_ADDRESS, "no vault address");
  if (!equal(address, vault->key, 32)) return fail(E_WRONG_PROGRAM_ADDRESS, "the vault is not the program address of [\"vault\", treasury]");
  if (!authority->is_writable || !treasury->is_writable || !vault->is_writable) return fail(E_NOT_WRITABLE, "the authority, treasury and vault must be writable");
  tseeds[2].addr = &bump;
  SolSignerSeeds tsigner = {tseeds, 3};
  Create c = {authority, treasury, read_u64(d), sizeof(Treasury), &tsigner};
  if ((e = create_account(in, &c))) return e;
  vseeds[2].addr = &vbump;
  SolSignerSeeds vsigner = {vseeds, 3};
  Create v = {authority, vault, read_u64(d + 8), TOKEN_ACCOUNT_SIZE, &vsigner};
  if ((e = create_account_owned(in, &v, TOKEN_PROGRAM))) return e;
  u8 data[33];
  data[0] = 18; /* TokenInstruction::InitializeAccount3: owner */
  copy(data + 1, treasury->key, 32);
  SolAccountMeta metas[2] = {{vault->key, 1, 0}, {mint->key, 0, 0}};
  SolInstruction ix = {(u8 *)TOKEN_PROGRAM, metas, 2, data, 33};
  if ((e = sol_invoke_signed_c(&ix, in->accounts, in->account_count, NULL, 0))) return e;
  Treasury *t = (Treasury *)treasury->data;
  t->magic = TREASURY_MAGIC;
  copy(t->coordinator, coord->key, 32);
  copy(t->coordinator_program, coord->owner, 32);
  copy(t->authority, authority->key, 32);
  copy(t->mint, mint->key, 32);
  copy(t->vault, vault->key, 32);
  t->bump = bump;
  return 0;
}

/*
 * fund (the run's main authority): moves tokens from the authority's token account into the vault.
 * accounts: authority (signer), coordinator, treasury (writable), vault (writable), source token account (writable),
 * token program. data: amount u64
 */
static u64 fund(Input *in, const u8 *d, u64 len) {
  if (in->account_count < 6 || len != 8) return fail(E_INVALID_INSTRUCTION, "fund: expected authority, coordinator, treasury, vault, source, token program; an amount");
  SolAccountInfo *authority = &in->accounts[0], *vault = &in->accounts[3], *source = &in->accounts[4];
  if (!authority->is_signer) return fail(E_MISSING_SIGNATURE, "the run's main authority must sign");
  Treasury *t;
  const State *s;
  u64 e;
  if ((e = load(in, &t, &s))) return e;
  if (!equal(authority->key, s->main_authority, 32) || !equal(authority->key, t->authority, 32)) return fail(E_UNAUTHORIZED, "only the run's main authority funds its treasury");
  if ((e = check_vault(vault, t, in->accounts[2].key))) return e;
  if ((e = check_token_program(&in->accounts[5]))) return e;
  if (!source->is_writable) return fail(E_NOT_WRITABLE, "the source must be writable");
  u64 amount = read_u64(d);
  if (amount == 0) return fail(E_INVALID_INSTRUCTION, "fund: the amount must be positive");
  if (t->funded + amount < amount) return fail(E_NOT_PERMITTED, "fund: the treasury's funded total would pass a u64");
  t->funded += amount;
  u8 data[9];
  data[0] = 3; /* TokenInstruction::Transfer: amount */
  write_u64(data + 1, amount);
  SolAccountMeta metas[3] = {{source->key, 1, 0}, {vault->key, 1, 0}, {authority->key, 0, 1}};
  SolInstruction ix = {(u8 *)TOKEN_PROGRAM, metas, 3, data, 9};
  return sol_invoke_signed_c(&ix, in->accounts, in->account_count, NULL, 0);
}

/* The earned points of `key` in the coordinator's rewards ledger (0: no entry). Keys compare as 4 u64s. */
static u64 earned_points(const State *s, const u8 *key) {
  const u64 *k = (const u64 *)key;
  u64 n = s->ledger_len < LEDGER_MAX ? s->ledger_len : LEDGER_MAX;
  for (u64 i = 0; i < n; i++) {
    const u64 *e = (const u64 *)s->ledger[i].key;
    if (e[0] == k[0] && e[1] == k[1] && e[2] == k[2] && e[3] == k[3]) return s->ledger[i].earned;
  }
  return 0;
}

/*
 * claim (a client, for its own points): pays (earned − claimed) × token_rate from the vault to a token account of
 * the mint, and records claimed = earned in the client's participant record (created on its first claim).
 * accounts: client (signer, writable: pays a new record), coordinator, treasury (writable), vault (writable),
 * participant (writable), destination token account (writable), system program, token program.
 * data: lamports u64 (rent exemption of a Participant, for a first claim)
 */
static u64 claim(Input *in, const u8 *d, u64 len) {
  if (in->account_count < 8 || len != 8)
    return fail(E_INVALID_INSTRUCTION, "claim: expected client, coordinator, treasury, vault, participant, destination, system program, token program; rent amount");
  SolAccountInfo *client = &in->accounts[0], *treasury = &in->accounts[2], *vault = &in->accounts[3], *record = &in->accounts[4], *dest = &in->accounts[5];
  if (!client->is_signer) return fail(E_MISSING_SIGNATURE, "the client must sign its claim");
  Treasury *t;
  const State *s;
  u64 e;
  if ((e = load(in, &t, &s))) return e;
  if (!equal(s->main_authority, t->authority, 32)) return fail(E_NOT_PERMITTED, "the run's main authority is not the one that created this treasury");
  if ((e = check_vault(vault, t, treasury->key))) return e;
  if ((e = check_token_program(&in->accounts[7]))) return e;
  SolSignerSeed pseeds[4] = {{(const u8 *)"participant", 11}, {treasury->key, 32}, {client->key, 32}, {NULL, 1}};
  u8 address[32], pbump;
  if (sol_try_find_program_address(pseeds, 3, in->program_id, address, &pbump)) return fail(E_WRONG_PROGRAM_ADDRESS, "no participant address");
  if (!equal(address, record->key, 32)) return fail(E_WRONG_PROGRAM_ADDRESS, "the participant record is not the program address of [\"participant\", treasury, client]");
  u8 exists = equal(record->owner, in->program_id, 32);
  Participant *p = (Participant *)record->data;
  if (exists && (record->data_len != sizeof(Participant) || p->magic != PARTICIPANT_MAGIC)) return fail(E_WRONG_ACCOUNT, "not a participant record of this program");
  if (!record->is_writable || !dest->is_writable) return fail(E_NOT_WRITABLE, "the participant record and the destination must be writable");
  u64 earned = earned_points(s, client->key), claimed = exists ? p->claimed : 0;
  if (earned <= claimed) return fail(E_NOTHING_TO_CLAIM, "this key has no points left to claim");
  if (s->token_rate == 0) return fail(E_NOT_PERMITTED, "the run's token rate is 0: its main authority sets one with set_rates");
  u64 points = earned - claimed;
  if (points > max_factor(s->token_rate)) return fail(E_NOT_PERMITTED, "points × token rate exceeds a u64 token amount: the run's authority must lower the token rate");
  u64 amount = points * s->token_rate;
  if (read_u64(vault->data + 64) < amount) return fail(E_TREASURY_EMPTY, "the treasury holds less than this claim pays: the run's authority must fund it");
  if ((exists && p->paid + amount < amount) || t->paid + amount < amount || t->claimed + points < points) return fail(E_NOT_PERMITTED, "the totals paid would pass a u64");
  if (!exists) {
    if (!client->is_writable) return fail(E_NOT_WRITABLE, "the client pays its new participant record: it must be writable");
    pseeds[3].addr = &pbump;
    SolSignerSeeds psigner = {pseeds, 4};
    Create c = {client, record, read_u64(d), sizeof(Participant), &psigner};
    if ((e = create_account(in, &c))) return e;
    p = (Participant *)record->data;
    p->magic = PARTICIPANT_MAGIC;
    copy(p->treasury, treasury->key, 32);
    copy(p->client, client->key, 32);
  }
  p->claimed = earned;
  p->paid += amount;
  t->claimed += points;
  t->paid += amount;
  u8 data[9];
  data[0] = 3; /* TokenInstruction::Transfer: amount */
  write_u64(data + 1, amount);
  SolAccountMeta metas[3] = {{vault->key, 1, 0}, {dest->key, 1, 0}, {treasury->key, 0, 1}};
  SolInstruction ix = {(u8 *)TOKEN_PROGRAM, metas, 3, data, 9};
  u8 tbump = (u8)t->bump;
  SolSignerSeed tseeds[3] = {{(const u8 *)"treasury", 8}, {t->coordinator, 32}, {&tbump, 1}};
  SolSignerSeeds signer = {tseeds, 3};
  SolAccountInfo infos[4] = {*vault, *dest, *treasury, in->accounts[7]};
  return sol_invoke_signed_c(&ix, infos, 4, &signer, 1);
}

u64 entrypoint(const u8 *input) {
  Input in;
  if (deserialize(input, &in)) return fail(E_INVALID_INSTRUCTION, "too many accounts");
  if (in.data_len < 1) return fail(E_INVALID_INSTRUCTION, "empty instruction");
  const u8 *d = in.data + 1;
  u64 len = in.data_len - 1;
  switch (in.data[0]) {
    case TIX_INIT_TREASURY:
      return init_treasury(&in, d, len);
    case TIX_FUND:
      return fund(&in, d, len);
    case TIX_CLAIM:
      return claim(&in, d, len);
    default:
      return fail(E_INVALID_INSTRUCTION, "unknown instruction");
  }
}
