/*
 * pjrt_abi.h — strata's own declarations of the subset of the PJRT C ABI
 * (v0.x, written against minor 114) that the runtime uses.
 *
 * These are NOT upstream's pjrt_c_api.h: they were written for strata from
 * the ABI's documented layout (openxla/xla xla/pjrt/c/pjrt_c_api.h was read,
 * not copied). Only what strata calls is declared; the function table keeps
 * upstream's exact slot order up to the last slot strata uses, with unused
 * slots declared as opaque pointers.
 *
 * ABI rules this file relies on (and why the layouts look the way they do):
 *   - every argument struct starts with {size_t struct_size; void* ext;}
 *     and the plugin rejects a struct_size smaller than its own, so argument
 *     structs are declared up to the *last field known at minor 114*, even
 *     fields strata never sets (they are zeroed);
 *   - new fields and new table slots are only ever appended, so a plugin
 *     with a newer minor still works; a plugin with an older minor may lack
 *     table slots, so callers check offsetof(slot) < api->struct_size.
 *
 * Names use a pj_ prefix so they can never clash with upstream's header.
 */
#ifndef STRATA_RUNTIME_PJRT_ABI_H
#define STRATA_RUNTIME_PJRT_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The ABI version these declarations describe. Major must match exactly;
 * the plugin's minor must be >= PJ_ABI_MIN_MINOR (the oldest minor whose
 * struct layouts agree with the ones below for every call strata makes). */
#define PJ_ABI_MAJOR 0
#define PJ_ABI_MINOR 114
#define PJ_ABI_MIN_MINOR 114

/* Opaque plugin objects. */
typedef struct pj_error pj_error;
typedef struct pj_event pj_event;
typedef struct pj_client pj_client;
typedef struct pj_device pj_device;
typedef struct pj_device_desc pj_device_desc;
typedef struct pj_memory pj_memory;
typedef struct pj_executable pj_executable;
typedef struct pj_loaded_exe pj_loaded_exe;
typedef struct pj_buffer pj_buffer;
typedef struct pj_serialized pj_serialized;

typedef struct pj_ext {
  size_t struct_size;
  int type;
  struct pj_ext* next;
} pj_ext;

/* Common header of every argument struct. */
#define PJ_HEAD   \
  size_t struct_size; \
  pj_ext* ext

/* Size up to and including |field| (the ABI's notion of struct size). */
#define PJ_SIZE(type, field) (offsetof(type, field) + sizeof(((type*)0)->field))

typedef struct pj_version {
  PJ_HEAD;
  int major;
  int minor;
} pj_version;

/*--- errors ---------------------------------------------------------------*/

typedef struct pj_error_destroy_args {
  PJ_HEAD;
  pj_error* error;
} pj_error_destroy_args;

typedef struct pj_error_message_args {
  PJ_HEAD;
  const pj_error* error;
  const char* message; /* out, lives as long as error */
  size_t message_size; /* out */
} pj_error_message_args;

typedef struct pj_error_code_args {
  PJ_HEAD;
  const pj_error* error;
  int code; /* out: absl status code */
} pj_error_code_args;

/*--- named values ---------------------------------------------------------*/

enum {
  PJ_NV_STRING = 0,
  PJ_NV_INT64 = 1,
  PJ_NV_INT64_LIST = 2,
  PJ_NV_FLOAT = 3,
  PJ_NV_BOOL = 4,
};

typedef struct pj_named_value {
  PJ_HEAD;
  const char* name;
  size_t name_size;
  int type;
  union {
    const char* s;
    int64_t i64;
    const int64_t* i64_list;
    float f;
    bool b;
  } v;
  size_t value_size; /* elements for strings/lists, 1 for scalars */
} pj_named_value;

/*--- plugin ---------------------------------------------------------------*/

typedef struct pj_plugin_init_args {
  PJ_HEAD;
} pj_plugin_init_args;

typedef struct pj_plugin_attrs_args {
  PJ_HEAD;
  const pj_named_value* attrs; /* out, process lifetime */
  size_t num_attrs;            /* out */
} pj_plugin_attrs_args;

/*--- events ---------------------------------------------------------------*/

typedef struct pj_event_args {
  PJ_HEAD;
  pj_event* event;
} pj_event_args; /* Destroy, Error, Await */

typedef struct pj_event_ready_args {
  PJ_HEAD;
  pj_event* event;
  bool is_ready; /* out */
} pj_event_ready_args;

/* The callback owns |error| and must destroy it. */
typedef void (*pj_on_ready_fn)(pj_error* error, void* user);

typedef struct pj_event_on_ready_args {
  PJ_HEAD;
  pj_event* event;
  pj_on_ready_fn callback;
  void* user;
} pj_event_on_ready_args;

/*--- client ---------------------------------------------------------------*/

/* Error codes (absl's numbering) strata hands back to the plugin from its
 * key-value callbacks, or reads from the plugin's errors. */
enum {
  PJ_CODE_INVALID_ARGUMENT = 3,
  PJ_CODE_DEADLINE_EXCEEDED = 4,
  PJ_CODE_NOT_FOUND = 5,
  PJ_CODE_RESOURCE_EXHAUSTED = 8,
  PJ_CODE_INTERNAL = 13,
};

/* The key-value callbacks a multi-process client uses to find its peers
 * (strata serves them from the job's store: kv_callbacks.c). The plugin
 * calls them from threads of its own. Keys and values are (pointer, size)
 * byte strings, not NUL-terminated. A callback fails by returning an error
 * made through the plugin's |callback_error|, which is a POINTER to the
 * plugin's function (called as (*callback_error)(code, msg, msg_size); the
 * plugin copies the message). A get or try-get hands back a value the
 * plugin copies and then passes to |value_deleter|, which the callback
 * sets. */
typedef pj_error* (*pj_callback_error_fn)(int code, const char* message, size_t message_size);
typedef void (*pj_kv_value_deleter_fn)(char* value);

typedef struct pj_kv_get_args {
  PJ_HEAD;
  const char* key;
  size_t key_size;
  int timeout_in_ms;
  pj_callback_error_fn* callback_error;
  void* user;
  char* value;                          /* out */
  size_t value_size;                    /* out */
  pj_kv_value_deleter_fn value_deleter; /* out */
} pj_kv_get_args;

/* Like get, but looks once: a missing key is a NOT_FOUND error at once. */
typedef struct pj_kv_try_get_args {
  PJ_HEAD;
  const char* key;
  size_t key_size;
  pj_callback_error_fn* callback_error;
  void* user;
  char* value;                          /* out */
  size_t value_size;                    /* out */
  pj_kv_value_deleter_fn value_deleter; /* out */
} pj_kv_try_get_args;

typedef struct pj_kv_put_args {
  PJ_HEAD;
  const char* key;
  size_t key_size;
  const char* value; /* lives for the call only */
  size_t value_size;
  pj_callback_error_fn* callback_error;
  void* user;
} pj_kv_put_args;

typedef pj_error* (*pj_kv_get_fn)(pj_kv_get_args* args);
typedef pj_error* (*pj_kv_try_get_fn)(pj_kv_try_get_args* args);
typedef pj_error* (*pj_kv_put_fn)(pj_kv_put_args* args);

/* Named create options: the CPU plugin takes cpu_device_count; the GPU
 * plugin takes node_id and num_nodes (int64) for a client across
 * processes. A plugin refuses a name it does not know. */
typedef struct pj_client_create_args {
  PJ_HEAD;
  const pj_named_value* options;
  size_t num_options;
  pj_kv_get_fn kv_get;
  void* kv_get_user;
  pj_kv_put_fn kv_put;
  void* kv_put_user;
  pj_client* client; /* out */
  pj_kv_try_get_fn kv_try_get; /* appended after |client|: older plugins ignore it */
  void* kv_try_get_user;
} pj_client_create_args;

typedef struct pj_client_args {
  PJ_HEAD;
  pj_client* client;
} pj_client_args; /* Destroy */

typedef struct pj_client_string_args {
  PJ_HEAD;
  pj_client* client;
  const char* str; /* out, lives as long as the client */
  size_t str_size; /* out */
} pj_client_string_args; /* PlatformName, PlatformVersion */

typedef struct pj_client_devices_args {
  PJ_HEAD;
  pj_client* client;
  pj_device* const* devices; /* out */
  size_t num_devices;        /* out */
} pj_client_devices_args; /* Devices, AddressableDevices */

typedef struct pj_program {
  PJ_HEAD;
  const char* code;
  size_t code_size;
  const char* format;
  size_t format_size;
} pj_program;

typedef struct pj_compile_args {
  PJ_HEAD;
  pj_client* client;
  const pj_program* program;
  const char* options; /* serialized xla.CompileOptionsProto */
  size_t options_size;
  pj_loaded_exe* executable; /* out */
} pj_compile_args;

/* PJRT element types (the ABI's numbering, not st_dtype's). */
enum {
  PJ_T_INVALID = 0,
  PJ_T_PRED = 1,
  PJ_T_S8 = 2,
  PJ_T_S16 = 3,
  PJ_T_S32 = 4,
  PJ_T_S64 = 5,
  PJ_T_U8 = 6,
  PJ_T_U16 = 7,
  PJ_T_U32 = 8,
  PJ_T_U64 = 9,
  PJ_T_F16 = 10,
  PJ_T_F32 = 11,
  PJ_T_F64 = 12,
  PJ_T_BF16 = 13,
};

enum {
  PJ_HOST_IMMUTABLE_ONLY_DURING_CALL = 0,
  PJ_HOST_IMMUTABLE_UNTIL_TRANSFER_COMPLETES = 1,
  PJ_HOST_IMMUTABLE_ZERO_COPY = 2,
  PJ_HOST_MUTABLE_ZERO_COPY = 3,
};

typedef struct pj_from_host_args {
  PJ_HEAD;
  pj_client* client;
  const void* data;
  int type;
  const int64_t* dims;
  size_t num_dims;
  const int64_t* byte_strides; /* NULL: dense row-major */
  size_t num_byte_strides;
  int semantics;
  pj_device* device;
  pj_memory* memory;   /* NULL: the device's default memory */
  void* device_layout; /* NULL: dense row-major */
  pj_event* done_with_host_buffer; /* out, caller destroys */
  pj_buffer* buffer;               /* out */
} pj_from_host_args;

/*--- devices and memories -------------------------------------------------*/

typedef struct pj_desc_id_args {
  PJ_HEAD;
  pj_device_desc* desc;
  int id; /* out */
} pj_desc_id_args;

typedef struct pj_desc_string_args {
  PJ_HEAD;
  pj_device_desc* desc;
  const char* str; /* out */
  size_t str_size; /* out */
} pj_desc_string_args; /* Kind, DebugString, ToString */

typedef struct pj_device_desc_args {
  PJ_HEAD;
  pj_device* device;
  pj_device_desc* desc; /* out */
} pj_device_desc_args;

typedef struct pj_device_memories_args {
  PJ_HEAD;
  pj_device* device;
  pj_memory* const* memories; /* out */
  size_t num_memories;        /* out */
} pj_device_memories_args;

typedef struct pj_device_default_memory_args {
  PJ_HEAD;
  pj_device* device;
  pj_memory* memory; /* out */
} pj_device_default_memory_args;

/* MemoryStats: allocator counters; every field but bytes_in_use may be
 * unset (the CPU plugin reports none of them, or fails the call). */
typedef struct pj_device_memory_stats_args {
  PJ_HEAD;
  pj_device* device;
  int64_t bytes_in_use;
  int64_t peak_bytes_in_use;
  bool peak_bytes_in_use_is_set;
  int64_t num_allocs;
  bool num_allocs_is_set;
  int64_t largest_alloc_size;
  bool largest_alloc_size_is_set;
  int64_t bytes_limit; /* the memory a user can allocate on the device */
  bool bytes_limit_is_set;
  int64_t bytes_reserved;
  bool bytes_reserved_is_set;
  int64_t peak_bytes_reserved;
  bool peak_bytes_reserved_is_set;
  int64_t bytes_reservable_limit;
  bool bytes_reservable_limit_is_set;
  int64_t largest_free_block_bytes;
  bool largest_free_block_bytes_is_set;
  int64_t pool_bytes;
  bool pool_bytes_is_set;
  int64_t peak_pool_bytes;
  bool peak_pool_bytes_is_set;
} pj_device_memory_stats_args;

typedef struct pj_memory_kind_args {
  PJ_HEAD;
  pj_memory* memory;
  const char* kind; /* out */
  size_t kind_size; /* out */
} pj_memory_kind_args;

/*--- executables ----------------------------------------------------------*/

typedef struct pj_executable_args {
  PJ_HEAD;
  pj_executable* executable;
} pj_executable_args; /* Executable_Destroy */

typedef struct pj_loaded_args {
  PJ_HEAD;
  pj_loaded_exe* executable;
} pj_loaded_args; /* LoadedExecutable_Destroy */

typedef struct pj_loaded_devices_args {
  PJ_HEAD;
  pj_loaded_exe* executable;
  pj_device* const* devices; /* out, owned by the executable */
  size_t num_devices;        /* out */
} pj_loaded_devices_args; /* LoadedExecutable_AddressableDevices */

typedef struct pj_get_executable_args {
  PJ_HEAD;
  pj_loaded_exe* loaded;
  pj_executable* executable; /* out, caller destroys */
} pj_get_executable_args;

typedef struct pj_num_outputs_args {
  PJ_HEAD;
  pj_executable* executable;
  size_t num_outputs; /* out */
} pj_num_outputs_args;

/* XLA's optimized program of an executable. Called twice: with
 * program->code NULL (the plugin sets code_size), then with a buffer of
 * that size the plugin fills; format and format_size are the plugin's. */
typedef struct pj_optimized_program_args {
  PJ_HEAD;
  pj_executable* executable;
  pj_program* program; /* in/out */
} pj_optimized_program_args;

/* XLA's memory analysis of a compiled executable (xla::CompiledMemoryStats):
 * what running it allocates besides the caller's buffers. All out. Declared
 * up to the last field a minor-114 plugin knows (peak and total), which
 * older plugins simply leave zero. */
typedef struct pj_compiled_memory_stats_args {
  PJ_HEAD;
  pj_executable* executable;
  int64_t code_bytes;     /* generated code */
  int64_t argument_bytes;
  int64_t output_bytes;
  int64_t alias_bytes;    /* of the arguments, reused for outputs (donation) */
  int64_t temp_bytes;     /* XLA's temporaries while it runs */
  int64_t host_code_bytes; /* the same five in host memory spaces */
  int64_t host_argument_bytes;
  int64_t host_output_bytes;
  int64_t host_alias_bytes;
  int64_t host_temp_bytes;
  int64_t peak_bytes;     /* the plugin's own peak estimate; 0 when unset */
  int64_t total_bytes;
} pj_compiled_memory_stats_args;

typedef struct pj_serialize_args {
  PJ_HEAD;
  const pj_executable* executable;
  const char* bytes; /* out, lives as long as |serialized| */
  size_t bytes_size; /* out */
  pj_serialized* serialized;               /* out */
  void (*deleter)(pj_serialized* serialized); /* out, call exactly once */
} pj_serialize_args;

typedef struct pj_deserialize_args {
  PJ_HEAD;
  pj_client* client;
  const char* bytes;
  size_t bytes_size;
  pj_loaded_exe* executable; /* out */
  const char* override_options; /* NULL: the options stored in |bytes| */
  size_t override_options_size;
  void* load_options; /* NULL */
} pj_deserialize_args;

typedef struct pj_execute_options {
  PJ_HEAD;
  void** send_callbacks;
  void** recv_callbacks;
  size_t num_send_ops;
  size_t num_recv_ops;
  int launch_id;
  const int64_t* non_donatable;
  size_t num_non_donatable;
  void* context;
  const char* call_location;
  size_t num_tasks;
  int* task_ids;
  int64_t* incarnation_ids;
  void* multi_slice_config;
  bool major_to_minor_for_callbacks;
  void* hlo_output_callbacks;
  size_t num_hlo_output_callbacks;
} pj_execute_options;

typedef struct pj_execute_args {
  PJ_HEAD;
  pj_loaded_exe* executable;
  pj_execute_options* options; /* never NULL: the plugin dereferences it */
  pj_buffer* const* const* argument_lists; /* [num_devices][num_args] */
  size_t num_devices;
  size_t num_args;
  pj_buffer** const* output_lists; /* [num_devices][num_outputs], caller-allocated */
  pj_event** device_complete_events; /* optional, [num_devices] */
  pj_device* execute_device;         /* set for portable executables */
} pj_execute_args;

/*--- buffers --------------------------------------------------------------*/

typedef struct pj_buffer_args {
  PJ_HEAD;
  pj_buffer* buffer;
} pj_buffer_args; /* Destroy, Delete */

typedef struct pj_buffer_type_args {
  PJ_HEAD;
  pj_buffer* buffer;
  int type; /* out */
} pj_buffer_type_args;

typedef struct pj_buffer_dims_args {
  PJ_HEAD;
  pj_buffer* buffer;
  const int64_t* dims; /* out, lives as long as the buffer */
  size_t num_dims;     /* out */
} pj_buffer_dims_args;

typedef struct pj_buffer_bool_args {
  PJ_HEAD;
  pj_buffer* buffer;
  bool value; /* out */
} pj_buffer_bool_args; /* IsDeleted */

typedef struct pj_to_host_args {
  PJ_HEAD;
  pj_buffer* src;
  void* host_layout; /* NULL: the buffer's layout (dense row-major on CPU) */
  void* dst;
  size_t dst_size;
  pj_event* event; /* out */
} pj_to_host_args;

typedef struct pj_buffer_event_args {
  PJ_HEAD;
  pj_buffer* buffer;
  pj_event* event; /* out */
} pj_buffer_event_args; /* ReadyEvent */

typedef struct pj_copy_to_memory_args {
  PJ_HEAD;
  pj_buffer* buffer;
  pj_memory* dst_memory;
  pj_buffer* dst_buffer; /* out, caller destroys */
} pj_copy_to_memory_args;

typedef struct pj_copy_to_device_args {
  PJ_HEAD;
  pj_buffer* buffer;
  pj_device* dst_device;
  pj_buffer* dst_buffer; /* out, caller destroys */
} pj_copy_to_device_args;

/*--- the function table ---------------------------------------------------*/

#define PJ_FN(name, args_type) pj_error* (*name)(args_type * args)
#define PJ_UNUSED(name) void* name

typedef struct pj_api {
  size_t struct_size;
  pj_ext* ext;
  pj_version version;

  void (*error_destroy)(pj_error_destroy_args* args);
  void (*error_message)(pj_error_message_args* args);
  PJ_FN(error_get_code, pj_error_code_args);

  PJ_FN(plugin_initialize, pj_plugin_init_args);
  PJ_FN(plugin_attributes, pj_plugin_attrs_args);

  PJ_FN(event_destroy, pj_event_args);
  PJ_FN(event_is_ready, pj_event_ready_args);
  PJ_FN(event_error, pj_event_args);
  PJ_FN(event_await, pj_event_args);
  PJ_FN(event_on_ready, pj_event_on_ready_args);

  PJ_FN(client_create, pj_client_create_args);
  PJ_FN(client_destroy, pj_client_args);
  PJ_FN(client_platform_name, pj_client_string_args);
  PJ_UNUSED(client_process_index);
  PJ_FN(client_platform_version, pj_client_string_args);
  PJ_FN(client_devices, pj_client_devices_args);
  PJ_FN(client_addressable_devices, pj_client_devices_args);
  PJ_UNUSED(client_lookup_device);
  PJ_UNUSED(client_lookup_addressable_device);
  PJ_UNUSED(client_addressable_memories);
  PJ_FN(client_compile, pj_compile_args);
  PJ_UNUSED(client_default_device_assignment);
  PJ_FN(client_buffer_from_host, pj_from_host_args);

  PJ_FN(desc_id, pj_desc_id_args);
  PJ_UNUSED(desc_process_index);
  PJ_UNUSED(desc_attributes);
  PJ_FN(desc_kind, pj_desc_string_args);
  PJ_FN(desc_debug_string, pj_desc_string_args);
  PJ_FN(desc_to_string, pj_desc_string_args);

  PJ_FN(device_get_description, pj_device_desc_args);
  PJ_UNUSED(device_is_addressable);
  PJ_UNUSED(device_local_hardware_id);
  PJ_FN(device_addressable_memories, pj_device_memories_args);
  PJ_FN(device_default_memory, pj_device_default_memory_args);
  PJ_FN(device_memory_stats, pj_device_memory_stats_args);

  PJ_UNUSED(memory_id);
  PJ_FN(memory_kind, pj_memory_kind_args);
  PJ_UNUSED(memory_debug_string);
  PJ_UNUSED(memory_to_string);
  PJ_UNUSED(memory_addressable_by_devices);

  PJ_FN(executable_destroy, pj_executable_args);
  PJ_UNUSED(executable_name);
  PJ_UNUSED(executable_num_replicas);
  PJ_UNUSED(executable_num_partitions);
  PJ_FN(executable_num_outputs, pj_num_outputs_args);
  PJ_UNUSED(executable_code_size);
  PJ_UNUSED(executable_cost_analysis);
  PJ_UNUSED(executable_output_memory_kinds);
  PJ_FN(executable_optimized_program, pj_optimized_program_args);
  PJ_FN(executable_serialize, pj_serialize_args);

  PJ_FN(loaded_destroy, pj_loaded_args);
  PJ_FN(loaded_get_executable, pj_get_executable_args);
  PJ_FN(loaded_addressable_devices, pj_loaded_devices_args);
  PJ_UNUSED(loaded_delete);
  PJ_UNUSED(loaded_is_deleted);
  PJ_FN(loaded_execute, pj_execute_args);
  PJ_FN(executable_deserialize_and_load, pj_deserialize_args);
  PJ_UNUSED(loaded_fingerprint);

  PJ_FN(buffer_destroy, pj_buffer_args);
  PJ_FN(buffer_element_type, pj_buffer_type_args);
  PJ_FN(buffer_dimensions, pj_buffer_dims_args);
  PJ_UNUSED(buffer_unpadded_dimensions);
  PJ_UNUSED(buffer_dynamic_dimension_indices);
  PJ_UNUSED(buffer_get_memory_layout);
  PJ_UNUSED(buffer_on_device_size);
  PJ_UNUSED(buffer_device);
  PJ_UNUSED(buffer_memory);
  PJ_UNUSED(buffer_delete);
  PJ_FN(buffer_is_deleted, pj_buffer_bool_args);
  /* May be NULL in a plugin that lacks it (st__api_has_copy_to_device). */
  PJ_FN(buffer_copy_to_device, pj_copy_to_device_args);
  PJ_FN(buffer_to_host, pj_to_host_args);
  PJ_UNUSED(buffer_is_on_cpu);
  PJ_FN(buffer_ready_event, pj_buffer_event_args);
  PJ_UNUSED(buffer_unsafe_pointer);
  PJ_UNUSED(buffer_increase_external_refcount);
  PJ_UNUSED(buffer_decrease_external_refcount);
  PJ_UNUSED(buffer_opaque_device_memory_pointer);

  PJ_UNUSED(copy_stream_destroy);
  PJ_UNUSED(copy_stream_add_chunk);
  PJ_UNUSED(copy_stream_total_bytes);
  PJ_UNUSED(copy_stream_granule_size);
  PJ_UNUSED(copy_stream_current_bytes);

  PJ_UNUSED(topology_create);
  PJ_UNUSED(topology_destroy);
  PJ_UNUSED(topology_platform_name);
  PJ_UNUSED(topology_platform_version);
  PJ_UNUSED(topology_device_descriptions);
  PJ_UNUSED(topology_serialize);
  PJ_UNUSED(topology_attributes);

  PJ_UNUSED(compile);
  PJ_UNUSED(executable_output_element_types);
  PJ_UNUSED(executable_output_dimensions);
  /* Optional: callers check offsetof(pj_api, buffer_copy_to_memory) <
   * api->struct_size (st__api_has_copy_to_memory). */
  PJ_FN(buffer_copy_to_memory, pj_copy_to_memory_args);
  PJ_UNUSED(client_create_view_of_device_buffer);
  PJ_UNUSED(executable_fingerprint);
  PJ_UNUSED(client_topology_description);
  /* Optional too: callers check offsetof(pj_api,
   * executable_compiled_memory_stats) < api->struct_size. */
  PJ_FN(executable_compiled_memory_stats, pj_compiled_memory_stats_args);
  /* Later slots are not used by strata. */
} pj_api;

#undef PJ_FN
#undef PJ_UNUSED

/* The loader checks once that the plugin's table reaches the last slot
 * strata calls (buffer_ready_event); a slot added later must move that
 * check or be tested with offsetof(pj_api, slot) < api->struct_size. */

/*--- the FFI extension ------------------------------------------------------*/

/* Extension types found walking api->ext (upstream's PJRT_Extension_Type
 * order: GPU custom call 0, profiler 1, custom partitioner 2, stream 3,
 * layouts 4, FFI 5). Only FFI is used. */
#define PJ_EXT_TYPE_FFI 5

/* Registers an XLA FFI handler (typed calling convention) for a platform.
 * Unlike every other argument struct, this one has no extension pointer;
 * the 0.115 CPU plugin checks struct_size against 52 bytes: up to traits. */
typedef struct pj_ffi_register_args {
  size_t struct_size;
  const char* target_name;
  size_t target_name_size;
  void* handler; /* XLA_FFI_Handler*, src/kernels/ffi_abi.h */
  const char* platform_name;
  size_t platform_name_size;
  uint32_t traits;
} pj_ffi_register_args;

/* The extension: its header, then three entry points (type registration and
 * user data are not used by strata). */
typedef struct pj_ffi_ext {
  pj_ext base;
  void* type_id_register;
  void* user_data_add;
  pj_error* (*register_handler)(pj_ffi_register_args* args);
} pj_ffi_ext;

typedef const pj_api* (*pj_get_api_fn)(void);

/*--- pins -------------------------------------------------------------------*/

/* The layouts above, pinned: a field dropped, reordered or retyped here is a
 * build error, not a plugin reading garbage. The numbers are upstream's
 * <Name>_STRUCT_SIZE (PJRT_DEFINE_STRUCT_TRAITS: offsetof(last field) +
 * its size) for LP64, and PJRT_Api's slot offsets (40 bytes of header: size,
 * extension, PJRT_Api_Version; then 8 per slot, in upstream's order).
 * Worked out from openxla/xla's xla/pjrt/c/pjrt_c_api.h as stored in this
 * project's reference corpus (minor 94) and checked against the minor-114
 * layout these declarations are written for: the ABI only appends, so
 * minor 94's sizes and offsets hold at 114. Two structs grew after 94 and
 * are pinned at 94's last field plus strata's 114 tail (execute options:
 * multi_slice_config .. num_hlo_output_callbacks; deserialize:
 * load_options). The FFI registration struct is the FFI extension
 * header's, and 52 is what the CPU plugin checks (above). The key-value
 * callbacks' structs (PJRT_KeyValueGetCallback_Args 80,
 * PJRT_KeyValueTryGetCallback_Args 72, PJRT_KeyValuePutCallback_Args 64)
 * and the create args' kv fields are checked against the same header: get
 * and put have had these layouts since they appeared; try-get and its two
 * create fields were appended later, before minor 114. */
_Static_assert(sizeof(void*) == 8 && sizeof(size_t) == 8 && sizeof(int) == 4 && sizeof(bool) == 1,
               "pjrt_abi.h describes the LP64 layout");

#define PJ_PIN(type, last, size) \
  _Static_assert(PJ_SIZE(type, last) == (size), #type " through " #last " must be " #size " bytes (PJRT ABI)")
#define PJ_AT(type, field, offset) \
  _Static_assert(offsetof(type, field) == (offset), #type "." #field " must be at " #offset " (PJRT ABI)")
#define PJ_SLOT(field, index) \
  _Static_assert(offsetof(pj_api, field) == 40 + 8 * (index), "pj_api." #field " must be PJRT_Api slot " #index)

PJ_PIN(pj_ext, next, 24);
PJ_PIN(pj_version, minor, 24);
PJ_PIN(pj_error_destroy_args, error, 24);
PJ_PIN(pj_error_message_args, message_size, 40);
PJ_PIN(pj_error_code_args, code, 28);
PJ_AT(pj_named_value, type, 32);
PJ_AT(pj_named_value, v, 40);
PJ_PIN(pj_named_value, value_size, 56);
PJ_PIN(pj_plugin_init_args, ext, 16);
PJ_PIN(pj_plugin_attrs_args, num_attrs, 32);
PJ_PIN(pj_event_args, event, 24);
PJ_PIN(pj_event_ready_args, is_ready, 25);
PJ_PIN(pj_event_on_ready_args, user, 40);
PJ_AT(pj_client_create_args, kv_get, 32);
PJ_AT(pj_client_create_args, kv_put_user, 56);
PJ_AT(pj_client_create_args, client, 64);
PJ_AT(pj_client_create_args, kv_try_get, 72);
PJ_PIN(pj_client_create_args, kv_try_get_user, 88);
PJ_AT(pj_kv_get_args, timeout_in_ms, 32);
PJ_AT(pj_kv_get_args, callback_error, 40);
PJ_AT(pj_kv_get_args, value, 56);
PJ_PIN(pj_kv_get_args, value_deleter, 80);
PJ_AT(pj_kv_try_get_args, callback_error, 32);
PJ_AT(pj_kv_try_get_args, value, 48);
PJ_PIN(pj_kv_try_get_args, value_deleter, 72);
PJ_AT(pj_kv_put_args, value, 32);
PJ_AT(pj_kv_put_args, callback_error, 48);
PJ_PIN(pj_kv_put_args, user, 64);
PJ_PIN(pj_client_args, client, 24);
PJ_PIN(pj_client_string_args, str_size, 40);
PJ_PIN(pj_client_devices_args, num_devices, 40);
PJ_PIN(pj_program, format_size, 48);
PJ_AT(pj_compile_args, options, 32);
PJ_PIN(pj_compile_args, executable, 56);
PJ_AT(pj_from_host_args, type, 32);
PJ_AT(pj_from_host_args, dims, 40);
PJ_AT(pj_from_host_args, semantics, 72);
PJ_AT(pj_from_host_args, device, 80);
PJ_AT(pj_from_host_args, memory, 88);
PJ_AT(pj_from_host_args, done_with_host_buffer, 104);
PJ_PIN(pj_from_host_args, buffer, 120);
PJ_PIN(pj_desc_id_args, id, 28);
PJ_PIN(pj_desc_string_args, str_size, 40);
PJ_PIN(pj_device_desc_args, desc, 32);
PJ_PIN(pj_device_memories_args, num_memories, 40);
PJ_PIN(pj_device_default_memory_args, memory, 32);
PJ_AT(pj_device_memory_stats_args, bytes_in_use, 24);
PJ_AT(pj_device_memory_stats_args, peak_bytes_in_use_is_set, 40);
PJ_AT(pj_device_memory_stats_args, bytes_limit, 80);
PJ_AT(pj_device_memory_stats_args, bytes_limit_is_set, 88);
PJ_PIN(pj_device_memory_stats_args, peak_pool_bytes_is_set, 185);
PJ_PIN(pj_memory_kind_args, kind_size, 40);
PJ_PIN(pj_executable_args, executable, 24);
PJ_PIN(pj_loaded_args, executable, 24);
PJ_PIN(pj_loaded_devices_args, num_devices, 40);
PJ_PIN(pj_get_executable_args, executable, 32);
PJ_PIN(pj_num_outputs_args, num_outputs, 32);
PJ_PIN(pj_optimized_program_args, program, 32);
PJ_AT(pj_compiled_memory_stats_args, temp_bytes, 56);
PJ_AT(pj_compiled_memory_stats_args, host_temp_bytes, 96);
PJ_PIN(pj_compiled_memory_stats_args, total_bytes, 120);
PJ_PIN(pj_serialize_args, deleter, 56);
PJ_AT(pj_deserialize_args, executable, 40);
PJ_PIN(pj_deserialize_args, override_options_size, 64); /* minor 94's last field */
PJ_PIN(pj_deserialize_args, load_options, 72);
PJ_AT(pj_execute_options, launch_id, 48);
PJ_AT(pj_execute_options, non_donatable, 56);
PJ_AT(pj_execute_options, context, 72);
PJ_PIN(pj_execute_options, incarnation_ids, 112); /* minor 94's last field */
PJ_PIN(pj_execute_options, num_hlo_output_callbacks, 144);
PJ_AT(pj_execute_args, argument_lists, 32);
PJ_AT(pj_execute_args, output_lists, 56);
PJ_PIN(pj_execute_args, execute_device, 80);
PJ_PIN(pj_buffer_args, buffer, 24);
PJ_PIN(pj_buffer_type_args, type, 28);
PJ_PIN(pj_buffer_dims_args, num_dims, 40);
PJ_PIN(pj_buffer_bool_args, value, 25);
PJ_PIN(pj_to_host_args, event, 56);
PJ_PIN(pj_buffer_event_args, event, 32);
PJ_PIN(pj_copy_to_memory_args, dst_buffer, 40);
PJ_PIN(pj_copy_to_device_args, dst_buffer, 40);
PJ_PIN(pj_ffi_register_args, traits, 52);
PJ_AT(pj_ffi_ext, register_handler, 40);

PJ_AT(pj_api, version, 16);
PJ_SLOT(error_destroy, 0);
PJ_SLOT(error_message, 1);
PJ_SLOT(error_get_code, 2);
PJ_SLOT(plugin_initialize, 3);
PJ_SLOT(plugin_attributes, 4);
PJ_SLOT(event_destroy, 5);
PJ_SLOT(event_on_ready, 9);
PJ_SLOT(client_create, 10);
PJ_SLOT(client_platform_name, 12);
PJ_SLOT(client_platform_version, 14);
PJ_SLOT(client_devices, 15);
PJ_SLOT(client_addressable_devices, 16);
PJ_SLOT(client_compile, 20);
PJ_SLOT(client_buffer_from_host, 22);
PJ_SLOT(desc_id, 23);
PJ_SLOT(desc_kind, 26);
PJ_SLOT(desc_to_string, 28);
PJ_SLOT(device_get_description, 29);
PJ_SLOT(device_addressable_memories, 32);
PJ_SLOT(device_default_memory, 33);
PJ_SLOT(device_memory_stats, 34);
PJ_SLOT(memory_kind, 36);
PJ_SLOT(executable_destroy, 40);
PJ_SLOT(executable_num_outputs, 44);
PJ_SLOT(executable_optimized_program, 48);
PJ_SLOT(executable_serialize, 49);
PJ_SLOT(loaded_destroy, 50);
PJ_SLOT(loaded_get_executable, 51);
PJ_SLOT(loaded_addressable_devices, 52);
PJ_SLOT(loaded_execute, 55);
PJ_SLOT(executable_deserialize_and_load, 56);
PJ_SLOT(buffer_destroy, 58);
PJ_SLOT(buffer_element_type, 59);
PJ_SLOT(buffer_dimensions, 60);
PJ_SLOT(buffer_is_deleted, 68);
PJ_SLOT(buffer_copy_to_device, 69);
PJ_SLOT(buffer_to_host, 70);
PJ_SLOT(buffer_ready_event, 72);
PJ_SLOT(compile, 89);
PJ_SLOT(buffer_copy_to_memory, 92);
PJ_SLOT(executable_compiled_memory_stats, 96);

#undef PJ_PIN
#undef PJ_AT
#undef PJ_SLOT

#endif /* STRATA_RUNTIME_PJRT_ABI_H */
