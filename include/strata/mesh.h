/*
 * strata/mesh.h — programs over several devices (docs/parallelism.md). Part
 * of the runtime module (src/runtime/mesh.c); read strata/runtime.h first.
 *
 * Objects and lifetimes
 *   st_mesh      a value: named axes with sizes and the runtime device of
 *                each mesh index (row-major over the axes, the last axis
 *                fastest). Plain data, no ownership; copied where kept.
 *   st_sharding  a value: how one logical tensor is laid out on a mesh.
 *   st_program   an SPMD program (st_program_compile_spmd) is compiled for
 *                one mesh: num_partitions = the mesh's devices, partition p
 *                on the mesh's device p. Destroy with st_program_destroy.
 *                st_program_execute refuses it; st_program_execute_spmd
 *                runs it with one argument list per device.
 *   st_sharded   one logical tensor backed by one st_buffer per mesh
 *                device (its shards), plus its global type and sharding.
 *                It owns its shards: st_sharded_destroy destroys them.
 *
 * Donation, events and transfers work per device: a donated shard is
 * consumed on its own device (st_buffer_is_consumed), an SPMD execution
 * gives one completion event per device, and each shard can be read or
 * awaited on its own through the st_buffer calls.
 */
#ifndef STRATA_MESH_H
#define STRATA_MESH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/runtime.h"
#include "strata/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ST_MESH_MAX_AXES 4
#define ST_MESH_MAX_DEVICES 256
#define ST_MESH_AXIS_NAME_MAX 16 /* bytes, with the NUL */

typedef struct st_mesh {
  int axis_count;
  char axis_names[ST_MESH_MAX_AXES][ST_MESH_AXIS_NAME_MAX];
  int axis_sizes[ST_MESH_MAX_AXES];
  int device_count;                 /* product of axis_sizes */
  int devices[ST_MESH_MAX_DEVICES]; /* runtime device index of mesh index p */
} st_mesh;

/* Fills |out| with axes |names|/|sizes| (|axis_count| of them, 1..4, sizes
 * >= 1, names distinct, letters/digits/_) on runtime devices |devices|
 * (device_count entries, distinct, >= 0; NULL means 0, 1, ..., n-1).
 * Errors (ST_CODE_CONFIG) name the bad axis or device. Whether the devices
 * exist is checked when a program is compiled for the mesh. */
st_status st_mesh_make(int axis_count, const char* const* names, const int* sizes, const int* devices, st_mesh* out);
/* Index of axis |name|, -1 when the mesh has none. */
int st_mesh_axis(const st_mesh* mesh, const char* name);
/* Coordinate of mesh index |p| along axis |axis|. */
int st_mesh_coord(const st_mesh* mesh, int p, int axis);

/*===-------------------------------------------------------------------===*/
/* SPMD programs                                                            */
/*===-------------------------------------------------------------------===*/

/* Compiles |code| (StableHLO from strata_jax.parallel: Shardy annotations,
 * mhlo.num_partitions = the mesh's devices) as one SPMD program over
 * |mesh|, through the executable cache when enabled (the key covers the
 * mesh's devices). |local_signature| gives the types of ONE device's
 * inputs and outputs (every device's are the same); the text's @main has
 * the global types, so when it is NULL only the counts and donation come
 * from the text and input types are not checked. Errors name the program
 * and, for a device the runtime lacks, the device. */
st_status st_program_compile_spmd(st_runtime* runtime, const char* name, const void* code, size_t code_size,
                                  const st_mesh* mesh, const st_program_signature* local_signature,
                                  st_program** out_program /* owned by caller */);
st_status st_program_compile_spmd_file(st_runtime* runtime, const char* path, const st_mesh* mesh,
                                       const st_program_signature* local_signature,
                                       st_program** out_program /* owned by caller */);

/* Devices the program runs on at once: the mesh's for an SPMD program, 1
 * otherwise. */
int st_program_device_count(const st_program* program);
/* Runtime device of partition |p| (-1 when out of range); for a
 * one-device program, -1 (it runs where st_program_execute says). */
int st_program_partition_device(const st_program* program, int p);

/* Runs an SPMD program on all its devices at once. |inputs| holds
 * device_count * input_count buffers, partition-major: inputs[p *
 * input_count + i] is input i of partition p and must live on partition
 * p's device. Each list is checked as st_program_execute checks its one
 * (count, type, consumed, device, donated aliasing) before anything runs.
 * |outputs| (device_count * output_count entries, same order) receives new
 * buffers owned by the caller. |out_done|, when not NULL, has device_count
 * entries and receives one completion event per partition (owned by the
 * caller). Donated inputs are consumed on every device. Returns without
 * waiting. */
st_status st_program_execute_spmd(st_program* program, st_buffer* const* inputs, int input_count, st_buffer** outputs,
                                  int output_count, st_event** out_done);

/*===-------------------------------------------------------------------===*/
/* Sharded tensors                                                          */
/*===-------------------------------------------------------------------===*/

/* How one logical tensor lies on a mesh. Axes are bits (1u << axis index).
 *   split[d]  dimension d is cut over these axes (the shard index along d
 *             is the device's row-major coordinate over those axes, in mesh
 *             axis order). A dimension of size n cut k ways gets ceil(n/k)
 *             per shard; the last shards are padded with zeros.
 *   partial   the logical value is the SUM of the shards over these axes
 *             (gradients before their reduction).
 * Axes in neither are replicated: every device along them holds the same
 * shard. An axis may appear once at most. */
typedef struct st_sharding {
  uint32_t split[ST_MAX_RANK];
  uint32_t partial;
  /* outer[d] (a subset of split[d], usually 0): these axes cut dimension d
   * first, in exact blocks (the dimension must divide), and the other
   * axes of split[d] then cut each such block, padded as above: FSDP
   * sharding of a tensor-parallel block (dim 0 cut over tensor, then each
   * tensor block over fsdp). */
  uint32_t outer[ST_MAX_RANK];
} st_sharding;

/* The per-device type of a |global| tensor laid out by |sharding| on
 * |mesh|. Errors name the dimension or axis that does not fit. */
st_status st_sharding_local_type(const st_mesh* mesh, const st_tensor_type* global, const st_sharding* sharding,
                                 st_tensor_type* out_local);

typedef struct st_sharded st_sharded;

/* Copies the logical value |data| (dense, row-major, |global|'s bytes) to
 * every mesh device as its shard: the device's block of each split
 * dimension (zero-padded), the whole value on coordinate 0 of the partial
 * axes and zeros elsewhere (so the sum is the value). */
st_status st_sharded_from_host(st_runtime* runtime, const st_mesh* mesh, const st_tensor_type* global,
                               const st_sharding* sharding, const void* data,
                               st_sharded** out_sharded /* owned by caller */);
/* Wraps existing shards (|shards| has mesh->device_count entries, shard p
 * on mesh device p with the local type). Ownership of every shard moves to
 * the sharded tensor, also on failure (then they are destroyed). */
st_status st_sharded_wrap(st_runtime* runtime, const st_mesh* mesh, const st_tensor_type* global,
                          const st_sharding* sharding, st_buffer** shards,
                          st_sharded** out_sharded /* owned by caller */);
/* Reassembles the logical value into |dst| (|dst_size| = the global
 * type's bytes): split dimensions concatenated without padding, partial
 * axes summed (f32, f64, s32 only), replicated axes read from coordinate
 * 0. Waits for the copies. */
st_status st_sharded_to_host(st_sharded* sharded, void* dst, size_t dst_size);

const st_tensor_type* st_sharded_type(const st_sharded* sharded);       /* global (logical) */
const st_tensor_type* st_sharded_local_type(const st_sharded* sharded); /* one shard's */
const st_sharding* st_sharded_sharding(const st_sharded* sharded);
const st_mesh* st_sharded_mesh(const st_sharded* sharded);
/* Shard of mesh index |p|, borrowed (NULL when out of range). */
st_buffer* st_sharded_shard(const st_sharded* sharded, int p);
size_t st_sharded_bytes_per_device(const st_sharded* sharded);
bool st_sharded_is_consumed(const st_sharded* sharded); /* any shard donated away */
void st_sharded_destroy(st_sharded* sharded);           /* NULL is a no-op; destroys the shards */
/* Frees the sharded tensor but not its shards: their ownership moves to
 * |out_shards| (mesh->device_count entries, shard p at p). */
void st_sharded_release(st_sharded* sharded, st_buffer** out_shards);
/* st_sharded_to_host on shards someone else owns (|shards|: one per mesh
 * index, borrowed; each of |global|'s local type under |sharding|). */
st_status st_sharding_to_host(const st_mesh* mesh, const st_tensor_type* global, const st_sharding* sharding,
                              st_buffer* const* shards, void* dst, size_t dst_size);
/* The same from shards already on the host: |shards| has mesh->device_count
 * entries, shard p (|global| laid out by |sharding|: the local type's
 * bytes) at p; only the ones that count are read (coordinate 0 of the
 * replicated axes). The diag.dump writer gathers launches' tensors so. */
st_status st_sharding_assemble(const st_mesh* mesh, const st_tensor_type* global, const st_sharding* sharding,
                               const void* const* shards, void* dst, size_t dst_size);

/* st_program_execute_spmd on sharded tensors: input i of partition p is
 * shard p of inputs[i] (all on the program's mesh). Output i is wrapped as
 * a sharded tensor of global type |out_global[i]| and sharding
 * |out_shardings[i]| (the program's manifest entry says which); its shard
 * types must match. The outputs lie on the first input's mesh (with no
 * inputs, on a one-axis mesh "devices" over the program's devices).
 * |out_done| as for st_program_execute_spmd. */
st_status st_program_execute_sharded(st_program* program, st_sharded* const* inputs, int input_count,
                                     const st_tensor_type* out_global, const st_sharding* out_shardings,
                                     st_sharded** outputs /* each owned by caller */, int output_count,
                                     st_event** out_done);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_MESH_H */
