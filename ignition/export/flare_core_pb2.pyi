from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REGION_KIND_UNSPECIFIED: _ClassVar[RegionKind]
    REGION_KIND_WEIGHTS: _ClassVar[RegionKind]
    REGION_KIND_REQUEST_STATE: _ClassVar[RegionKind]
    REGION_KIND_SNAPSHOT_ROWS: _ClassVar[RegionKind]
    REGION_KIND_KV_PAGES: _ClassVar[RegionKind]
    REGION_KIND_STAGING: _ClassVar[RegionKind]
    REGION_KIND_SCRATCH: _ClassVar[RegionKind]
    REGION_KIND_GRAPH_POOL: _ClassVar[RegionKind]
    REGION_KIND_COLLECTIVES: _ClassVar[RegionKind]

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_BF16: _ClassVar[DType]
    DTYPE_F16: _ClassVar[DType]
    DTYPE_F32: _ClassVar[DType]
    DTYPE_I32: _ClassVar[DType]
    DTYPE_I64: _ClassVar[DType]
    DTYPE_U8: _ClassVar[DType]

class BufferRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BUFFER_ROLE_UNSPECIFIED: _ClassVar[BufferRole]
    BUFFER_ROLE_WEIGHT: _ClassVar[BufferRole]
    BUFFER_ROLE_REQUEST_STATE: _ClassVar[BufferRole]
    BUFFER_ROLE_KV_PAGES: _ClassVar[BufferRole]
    BUFFER_ROLE_SNAPSHOT_ROWS: _ClassVar[BufferRole]
    BUFFER_ROLE_STAGING_INPUT: _ClassVar[BufferRole]
    BUFFER_ROLE_OUTPUT: _ClassVar[BufferRole]

class GraphKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GRAPH_KIND_UNSPECIFIED: _ClassVar[GraphKind]
    GRAPH_KIND_DECODE: _ClassVar[GraphKind]
    GRAPH_KIND_PREFILL: _ClassVar[GraphKind]
    GRAPH_KIND_RESUME: _ClassVar[GraphKind]
    GRAPH_KIND_ADMIT: _ClassVar[GraphKind]
    GRAPH_KIND_SNAPSHOT: _ClassVar[GraphKind]
    GRAPH_KIND_RESTORE: _ClassVar[GraphKind]

class Semantic(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEMANTIC_UNSPECIFIED: _ClassVar[Semantic]
    SEMANTIC_DECODE_SLOTS: _ClassVar[Semantic]
    SEMANTIC_CHUNK_SLOT: _ClassVar[Semantic]
    SEMANTIC_CHUNK_TOKENS: _ClassVar[Semantic]
    SEMANTIC_CHUNK_LEN: _ClassVar[Semantic]
    SEMANTIC_CHUNK_SAMPLE: _ClassVar[Semantic]
    SEMANTIC_ADMIT_SLOT: _ClassVar[Semantic]
    SEMANTIC_ADMIT_TOKENS: _ClassVar[Semantic]
    SEMANTIC_ADMIT_LEN: _ClassVar[Semantic]
    SEMANTIC_ADMIT_CONSUMED: _ClassVar[Semantic]
    SEMANTIC_ADMIT_INT: _ClassVar[Semantic]
    SEMANTIC_ADMIT_FLOAT: _ClassVar[Semantic]
    SEMANTIC_ADMIT_SEED: _ClassVar[Semantic]
    SEMANTIC_RESUME_SLOT: _ClassVar[Semantic]
    SEMANTIC_MAINT_SLOT: _ClassVar[Semantic]
    SEMANTIC_MAINT_ROW: _ClassVar[Semantic]
    SEMANTIC_MAINT_EXPECT: _ClassVar[Semantic]
    SEMANTIC_MAINT_STATUS: _ClassVar[Semantic]
    SEMANTIC_COMPLETIONS: _ClassVar[Semantic]
    SEMANTIC_LOGITS: _ClassVar[Semantic]
    SEMANTIC_PAGE_TABLE: _ClassVar[Semantic]
    SEMANTIC_STOP_TOKENS: _ClassVar[Semantic]
    SEMANTIC_SAMPLE_MASK: _ClassVar[Semantic]
    SEMANTIC_SAMPLE_MASKED: _ClassVar[Semantic]

class AdmitIntField(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ADMIT_INT_TOP_K: _ClassVar[AdmitIntField]
    ADMIT_INT_MAX_NEW_TOKENS: _ClassVar[AdmitIntField]

class AdmitFloatField(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ADMIT_FLOAT_TEMPERATURE: _ClassVar[AdmitFloatField]
    ADMIT_FLOAT_TOP_P: _ClassVar[AdmitFloatField]
    ADMIT_FLOAT_MIN_P: _ClassVar[AdmitFloatField]
    ADMIT_FLOAT_REPETITION_PENALTY: _ClassVar[AdmitFloatField]
    ADMIT_FLOAT_PRESENCE_PENALTY: _ClassVar[AdmitFloatField]
    ADMIT_FLOAT_FREQUENCY_PENALTY: _ClassVar[AdmitFloatField]

class ContinuationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTINUATION_STATE_UNSPECIFIED: _ClassVar[ContinuationState]
    CONTINUATION_STATE_POSITIONAL_KV: _ClassVar[ContinuationState]
    CONTINUATION_STATE_CONTINUATION_ROWS: _ClassVar[ContinuationState]

class ToolParser(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_PARSER_UNSPECIFIED: _ClassVar[ToolParser]
    TOOL_PARSER_NONE: _ClassVar[ToolParser]
    TOOL_PARSER_JSON_IN_TAGS: _ClassVar[ToolParser]
    TOOL_PARSER_XML_FUNCTIONS: _ClassVar[ToolParser]
    TOOL_PARSER_JSON_ANSWER: _ClassVar[ToolParser]
    TOOL_PARSER_JSON_INSTRUCTED: _ClassVar[ToolParser]

class ReasoningParser(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REASONING_PARSER_UNSPECIFIED: _ClassVar[ReasoningParser]
    REASONING_PARSER_NONE: _ClassVar[ReasoningParser]
    REASONING_PARSER_THINK_TAGS: _ClassVar[ReasoningParser]
REGION_KIND_UNSPECIFIED: RegionKind
REGION_KIND_WEIGHTS: RegionKind
REGION_KIND_REQUEST_STATE: RegionKind
REGION_KIND_SNAPSHOT_ROWS: RegionKind
REGION_KIND_KV_PAGES: RegionKind
REGION_KIND_STAGING: RegionKind
REGION_KIND_SCRATCH: RegionKind
REGION_KIND_GRAPH_POOL: RegionKind
REGION_KIND_COLLECTIVES: RegionKind
DTYPE_UNSPECIFIED: DType
DTYPE_BF16: DType
DTYPE_F16: DType
DTYPE_F32: DType
DTYPE_I32: DType
DTYPE_I64: DType
DTYPE_U8: DType
BUFFER_ROLE_UNSPECIFIED: BufferRole
BUFFER_ROLE_WEIGHT: BufferRole
BUFFER_ROLE_REQUEST_STATE: BufferRole
BUFFER_ROLE_KV_PAGES: BufferRole
BUFFER_ROLE_SNAPSHOT_ROWS: BufferRole
BUFFER_ROLE_STAGING_INPUT: BufferRole
BUFFER_ROLE_OUTPUT: BufferRole
GRAPH_KIND_UNSPECIFIED: GraphKind
GRAPH_KIND_DECODE: GraphKind
GRAPH_KIND_PREFILL: GraphKind
GRAPH_KIND_RESUME: GraphKind
GRAPH_KIND_ADMIT: GraphKind
GRAPH_KIND_SNAPSHOT: GraphKind
GRAPH_KIND_RESTORE: GraphKind
SEMANTIC_UNSPECIFIED: Semantic
SEMANTIC_DECODE_SLOTS: Semantic
SEMANTIC_CHUNK_SLOT: Semantic
SEMANTIC_CHUNK_TOKENS: Semantic
SEMANTIC_CHUNK_LEN: Semantic
SEMANTIC_CHUNK_SAMPLE: Semantic
SEMANTIC_ADMIT_SLOT: Semantic
SEMANTIC_ADMIT_TOKENS: Semantic
SEMANTIC_ADMIT_LEN: Semantic
SEMANTIC_ADMIT_CONSUMED: Semantic
SEMANTIC_ADMIT_INT: Semantic
SEMANTIC_ADMIT_FLOAT: Semantic
SEMANTIC_ADMIT_SEED: Semantic
SEMANTIC_RESUME_SLOT: Semantic
SEMANTIC_MAINT_SLOT: Semantic
SEMANTIC_MAINT_ROW: Semantic
SEMANTIC_MAINT_EXPECT: Semantic
SEMANTIC_MAINT_STATUS: Semantic
SEMANTIC_COMPLETIONS: Semantic
SEMANTIC_LOGITS: Semantic
SEMANTIC_PAGE_TABLE: Semantic
SEMANTIC_STOP_TOKENS: Semantic
SEMANTIC_SAMPLE_MASK: Semantic
SEMANTIC_SAMPLE_MASKED: Semantic
ADMIT_INT_TOP_K: AdmitIntField
ADMIT_INT_MAX_NEW_TOKENS: AdmitIntField
ADMIT_FLOAT_TEMPERATURE: AdmitFloatField
ADMIT_FLOAT_TOP_P: AdmitFloatField
ADMIT_FLOAT_MIN_P: AdmitFloatField
ADMIT_FLOAT_REPETITION_PENALTY: AdmitFloatField
ADMIT_FLOAT_PRESENCE_PENALTY: AdmitFloatField
ADMIT_FLOAT_FREQUENCY_PENALTY: AdmitFloatField
CONTINUATION_STATE_UNSPECIFIED: ContinuationState
CONTINUATION_STATE_POSITIONAL_KV: ContinuationState
CONTINUATION_STATE_CONTINUATION_ROWS: ContinuationState
TOOL_PARSER_UNSPECIFIED: ToolParser
TOOL_PARSER_NONE: ToolParser
TOOL_PARSER_JSON_IN_TAGS: ToolParser
TOOL_PARSER_XML_FUNCTIONS: ToolParser
TOOL_PARSER_JSON_ANSWER: ToolParser
TOOL_PARSER_JSON_INSTRUCTED: ToolParser
REASONING_PARSER_UNSPECIFIED: ReasoningParser
REASONING_PARSER_NONE: ReasoningParser
REASONING_PARSER_THINK_TAGS: ReasoningParser

class Core(_message.Message):
    __slots__ = ("abi_version", "identity", "window", "buffers", "images", "graphs", "contract", "frontend", "qualification", "rank_layout")
    ABI_VERSION_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    GRAPHS_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_FIELD_NUMBER: _ClassVar[int]
    FRONTEND_FIELD_NUMBER: _ClassVar[int]
    QUALIFICATION_FIELD_NUMBER: _ClassVar[int]
    RANK_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    abi_version: int
    identity: Identity
    window: Window
    buffers: _containers.RepeatedCompositeFieldContainer[Buffer]
    images: _containers.RepeatedCompositeFieldContainer[KernelImage]
    graphs: _containers.RepeatedCompositeFieldContainer[Graph]
    contract: PreparedContract
    frontend: Frontend
    qualification: Qualification
    rank_layout: RankLayout
    def __init__(self, abi_version: _Optional[int] = ..., identity: _Optional[_Union[Identity, _Mapping]] = ..., window: _Optional[_Union[Window, _Mapping]] = ..., buffers: _Optional[_Iterable[_Union[Buffer, _Mapping]]] = ..., images: _Optional[_Iterable[_Union[KernelImage, _Mapping]]] = ..., graphs: _Optional[_Iterable[_Union[Graph, _Mapping]]] = ..., contract: _Optional[_Union[PreparedContract, _Mapping]] = ..., frontend: _Optional[_Union[Frontend, _Mapping]] = ..., qualification: _Optional[_Union[Qualification, _Mapping]] = ..., rank_layout: _Optional[_Union[RankLayout, _Mapping]] = ...) -> None: ...

class RankLayout(_message.Message):
    __slots__ = ("world_size", "peers", "collectives_wait_limit_offset")
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_WAIT_LIMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    world_size: int
    peers: _containers.RepeatedCompositeFieldContainer[RankBundle]
    collectives_wait_limit_offset: int
    def __init__(self, world_size: _Optional[int] = ..., peers: _Optional[_Iterable[_Union[RankBundle, _Mapping]]] = ..., collectives_wait_limit_offset: _Optional[int] = ...) -> None: ...

class RankBundle(_message.Message):
    __slots__ = ("rank", "window", "buffers", "graphs", "qualification")
    RANK_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    GRAPHS_FIELD_NUMBER: _ClassVar[int]
    QUALIFICATION_FIELD_NUMBER: _ClassVar[int]
    rank: int
    window: Window
    buffers: _containers.RepeatedCompositeFieldContainer[Buffer]
    graphs: _containers.RepeatedCompositeFieldContainer[Graph]
    qualification: Qualification
    def __init__(self, rank: _Optional[int] = ..., window: _Optional[_Union[Window, _Mapping]] = ..., buffers: _Optional[_Iterable[_Union[Buffer, _Mapping]]] = ..., graphs: _Optional[_Iterable[_Union[Graph, _Mapping]]] = ..., qualification: _Optional[_Union[Qualification, _Mapping]] = ...) -> None: ...

class Identity(_message.Message):
    __slots__ = ("engine_version", "recipe", "checkpoint_fingerprint", "config_fingerprint", "tokenizer_fingerprint", "device_name", "compute_capability_major", "compute_capability_minor", "sm_count", "driver_version", "cuda_version")
    ENGINE_VERSION_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_MAJOR_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_MINOR_FIELD_NUMBER: _ClassVar[int]
    SM_COUNT_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDA_VERSION_FIELD_NUMBER: _ClassVar[int]
    engine_version: str
    recipe: str
    checkpoint_fingerprint: str
    config_fingerprint: str
    tokenizer_fingerprint: str
    device_name: str
    compute_capability_major: int
    compute_capability_minor: int
    sm_count: int
    driver_version: int
    cuda_version: int
    def __init__(self, engine_version: _Optional[str] = ..., recipe: _Optional[str] = ..., checkpoint_fingerprint: _Optional[str] = ..., config_fingerprint: _Optional[str] = ..., tokenizer_fingerprint: _Optional[str] = ..., device_name: _Optional[str] = ..., compute_capability_major: _Optional[int] = ..., compute_capability_minor: _Optional[int] = ..., sm_count: _Optional[int] = ..., driver_version: _Optional[int] = ..., cuda_version: _Optional[int] = ...) -> None: ...

class Window(_message.Message):
    __slots__ = ("base", "size", "regions")
    BASE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    base: int
    size: int
    regions: _containers.RepeatedCompositeFieldContainer[Region]
    def __init__(self, base: _Optional[int] = ..., size: _Optional[int] = ..., regions: _Optional[_Iterable[_Union[Region, _Mapping]]] = ...) -> None: ...

class Region(_message.Message):
    __slots__ = ("kind", "offset", "size", "backed_bytes")
    KIND_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    BACKED_BYTES_FIELD_NUMBER: _ClassVar[int]
    kind: RegionKind
    offset: int
    size: int
    backed_bytes: int
    def __init__(self, kind: _Optional[_Union[RegionKind, str]] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., backed_bytes: _Optional[int] = ...) -> None: ...

class Buffer(_message.Message):
    __slots__ = ("name", "role", "offset", "size_bytes", "dtype", "shape", "strides", "initial_tensor")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    STRIDES_FIELD_NUMBER: _ClassVar[int]
    INITIAL_TENSOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: BufferRole
    offset: int
    size_bytes: int
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    strides: _containers.RepeatedScalarFieldContainer[int]
    initial_tensor: str
    def __init__(self, name: _Optional[str] = ..., role: _Optional[_Union[BufferRole, str]] = ..., offset: _Optional[int] = ..., size_bytes: _Optional[int] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., strides: _Optional[_Iterable[int]] = ..., initial_tensor: _Optional[str] = ...) -> None: ...

class KernelImage(_message.Message):
    __slots__ = ("sha256", "size_bytes")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    size_bytes: int
    def __init__(self, sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class Dim3(_message.Message):
    __slots__ = ("x", "y", "z")
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    Z_FIELD_NUMBER: _ClassVar[int]
    x: int
    y: int
    z: int
    def __init__(self, x: _Optional[int] = ..., y: _Optional[int] = ..., z: _Optional[int] = ...) -> None: ...

class KernelNode(_message.Message):
    __slots__ = ("image_sha256", "function", "grid", "block", "dynamic_shared_bytes", "params", "param_offsets", "param_sizes", "params_from_extra", "cluster", "cluster_scheduling_policy", "max_dynamic_shared_bytes", "non_portable_cluster_size_allowed")
    IMAGE_SHA256_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    GRID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    DYNAMIC_SHARED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    PARAM_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    PARAM_SIZES_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FROM_EXTRA_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_SCHEDULING_POLICY_FIELD_NUMBER: _ClassVar[int]
    MAX_DYNAMIC_SHARED_BYTES_FIELD_NUMBER: _ClassVar[int]
    NON_PORTABLE_CLUSTER_SIZE_ALLOWED_FIELD_NUMBER: _ClassVar[int]
    image_sha256: str
    function: str
    grid: Dim3
    block: Dim3
    dynamic_shared_bytes: int
    params: bytes
    param_offsets: _containers.RepeatedScalarFieldContainer[int]
    param_sizes: _containers.RepeatedScalarFieldContainer[int]
    params_from_extra: bool
    cluster: Dim3
    cluster_scheduling_policy: int
    max_dynamic_shared_bytes: int
    non_portable_cluster_size_allowed: bool
    def __init__(self, image_sha256: _Optional[str] = ..., function: _Optional[str] = ..., grid: _Optional[_Union[Dim3, _Mapping]] = ..., block: _Optional[_Union[Dim3, _Mapping]] = ..., dynamic_shared_bytes: _Optional[int] = ..., params: _Optional[bytes] = ..., param_offsets: _Optional[_Iterable[int]] = ..., param_sizes: _Optional[_Iterable[int]] = ..., params_from_extra: _Optional[bool] = ..., cluster: _Optional[_Union[Dim3, _Mapping]] = ..., cluster_scheduling_policy: _Optional[int] = ..., max_dynamic_shared_bytes: _Optional[int] = ..., non_portable_cluster_size_allowed: _Optional[bool] = ...) -> None: ...

class MemsetNode(_message.Message):
    __slots__ = ("dst", "pitch", "value", "element_size", "width", "height")
    DST_FIELD_NUMBER: _ClassVar[int]
    PITCH_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    ELEMENT_SIZE_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    dst: int
    pitch: int
    value: int
    element_size: int
    width: int
    height: int
    def __init__(self, dst: _Optional[int] = ..., pitch: _Optional[int] = ..., value: _Optional[int] = ..., element_size: _Optional[int] = ..., width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class MemcpyNode(_message.Message):
    __slots__ = ("dst", "src", "size_bytes")
    DST_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    dst: int
    src: int
    size_bytes: int
    def __init__(self, dst: _Optional[int] = ..., src: _Optional[int] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class EmptyNode(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Node(_message.Message):
    __slots__ = ("kernel", "memset", "memcpy", "empty")
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    MEMSET_FIELD_NUMBER: _ClassVar[int]
    MEMCPY_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELD_NUMBER: _ClassVar[int]
    kernel: KernelNode
    memset: MemsetNode
    memcpy: MemcpyNode
    empty: EmptyNode
    def __init__(self, kernel: _Optional[_Union[KernelNode, _Mapping]] = ..., memset: _Optional[_Union[MemsetNode, _Mapping]] = ..., memcpy: _Optional[_Union[MemcpyNode, _Mapping]] = ..., empty: _Optional[_Union[EmptyNode, _Mapping]] = ...) -> None: ...

class Edge(_message.Message):
    __slots__ = ("to", "from_port", "to_port", "type")
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    FROM_PORT_FIELD_NUMBER: _ClassVar[int]
    TO_PORT_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    to: int
    from_port: int
    to_port: int
    type: int
    def __init__(self, to: _Optional[int] = ..., from_port: _Optional[int] = ..., to_port: _Optional[int] = ..., type: _Optional[int] = ..., **kwargs) -> None: ...

class Graph(_message.Message):
    __slots__ = ("kind", "capacity", "nodes", "edges")
    KIND_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    kind: GraphKind
    capacity: int
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    edges: _containers.RepeatedCompositeFieldContainer[Edge]
    def __init__(self, kind: _Optional[_Union[GraphKind, str]] = ..., capacity: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., edges: _Optional[_Iterable[_Union[Edge, _Mapping]]] = ...) -> None: ...

class Binding(_message.Message):
    __slots__ = ("semantic", "buffer")
    SEMANTIC_FIELD_NUMBER: _ClassVar[int]
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    semantic: Semantic
    buffer: str
    def __init__(self, semantic: _Optional[_Union[Semantic, str]] = ..., buffer: _Optional[str] = ...) -> None: ...

class PreparedContract(_message.Message):
    __slots__ = ("page_size", "max_concurrency", "context_limit", "prefill_chunk_size", "decode_capacities", "prefill_capacities", "kv_pages", "bytes_per_page", "snapshot_rows", "vocab_size", "bindings", "completion_fields", "kv_page_axis", "continuation")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LIMIT_FIELD_NUMBER: _ClassVar[int]
    PREFILL_CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    DECODE_CAPACITIES_FIELD_NUMBER: _ClassVar[int]
    PREFILL_CAPACITIES_FIELD_NUMBER: _ClassVar[int]
    KV_PAGES_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_PAGE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ROWS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    BINDINGS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELDS_FIELD_NUMBER: _ClassVar[int]
    KV_PAGE_AXIS_FIELD_NUMBER: _ClassVar[int]
    CONTINUATION_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    max_concurrency: int
    context_limit: int
    prefill_chunk_size: int
    decode_capacities: _containers.RepeatedScalarFieldContainer[int]
    prefill_capacities: _containers.RepeatedScalarFieldContainer[int]
    kv_pages: int
    bytes_per_page: int
    snapshot_rows: int
    vocab_size: int
    bindings: _containers.RepeatedCompositeFieldContainer[Binding]
    completion_fields: _containers.RepeatedScalarFieldContainer[str]
    kv_page_axis: int
    continuation: ContinuationState
    def __init__(self, page_size: _Optional[int] = ..., max_concurrency: _Optional[int] = ..., context_limit: _Optional[int] = ..., prefill_chunk_size: _Optional[int] = ..., decode_capacities: _Optional[_Iterable[int]] = ..., prefill_capacities: _Optional[_Iterable[int]] = ..., kv_pages: _Optional[int] = ..., bytes_per_page: _Optional[int] = ..., snapshot_rows: _Optional[int] = ..., vocab_size: _Optional[int] = ..., bindings: _Optional[_Iterable[_Union[Binding, _Mapping]]] = ..., completion_fields: _Optional[_Iterable[str]] = ..., kv_page_axis: _Optional[int] = ..., continuation: _Optional[_Union[ContinuationState, str]] = ...) -> None: ...

class FloatRange(_message.Message):
    __slots__ = ("min", "max")
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    min: float
    max: float
    def __init__(self, min: _Optional[float] = ..., max: _Optional[float] = ...) -> None: ...

class SamplingDefaults(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "temperature_range", "top_k_range", "top_p_range", "min_p_range", "repetition_penalty_range", "presence_penalty_range", "frequency_penalty_range")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_RANGE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_RANGE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_RANGE_FIELD_NUMBER: _ClassVar[int]
    MIN_P_RANGE_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_RANGE_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_RANGE_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_RANGE_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    temperature_range: FloatRange
    top_k_range: FloatRange
    top_p_range: FloatRange
    min_p_range: FloatRange
    repetition_penalty_range: FloatRange
    presence_penalty_range: FloatRange
    frequency_penalty_range: FloatRange
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., temperature_range: _Optional[_Union[FloatRange, _Mapping]] = ..., top_k_range: _Optional[_Union[FloatRange, _Mapping]] = ..., top_p_range: _Optional[_Union[FloatRange, _Mapping]] = ..., min_p_range: _Optional[_Union[FloatRange, _Mapping]] = ..., repetition_penalty_range: _Optional[_Union[FloatRange, _Mapping]] = ..., presence_penalty_range: _Optional[_Union[FloatRange, _Mapping]] = ..., frequency_penalty_range: _Optional[_Union[FloatRange, _Mapping]] = ...) -> None: ...

class Marker(_message.Message):
    __slots__ = ("text", "token_id")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_id: int
    def __init__(self, text: _Optional[str] = ..., token_id: _Optional[int] = ...) -> None: ...

class ToolMarkers(_message.Message):
    __slots__ = ("call_start", "call_end", "separator")
    CALL_START_FIELD_NUMBER: _ClassVar[int]
    CALL_END_FIELD_NUMBER: _ClassVar[int]
    SEPARATOR_FIELD_NUMBER: _ClassVar[int]
    call_start: Marker
    call_end: Marker
    separator: str
    def __init__(self, call_start: _Optional[_Union[Marker, _Mapping]] = ..., call_end: _Optional[_Union[Marker, _Mapping]] = ..., separator: _Optional[str] = ...) -> None: ...

class ReasoningMarkers(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: Marker
    end: Marker
    def __init__(self, start: _Optional[_Union[Marker, _Mapping]] = ..., end: _Optional[_Union[Marker, _Mapping]] = ...) -> None: ...

class NamedToken(_message.Message):
    __slots__ = ("name", "content")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    content: str
    def __init__(self, name: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class Frontend(_message.Message):
    __slots__ = ("tokenizer_json", "chat_template", "eos_token_ids", "special_tokens", "sampling", "tool_parser", "reasoning_parser", "named_special_tokens", "tool_markers", "reasoning_markers")
    TOKENIZER_JSON_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TOOL_PARSER_FIELD_NUMBER: _ClassVar[int]
    REASONING_PARSER_FIELD_NUMBER: _ClassVar[int]
    NAMED_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOOL_MARKERS_FIELD_NUMBER: _ClassVar[int]
    REASONING_MARKERS_FIELD_NUMBER: _ClassVar[int]
    tokenizer_json: str
    chat_template: str
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    special_tokens: _containers.RepeatedScalarFieldContainer[str]
    sampling: SamplingDefaults
    tool_parser: ToolParser
    reasoning_parser: ReasoningParser
    named_special_tokens: _containers.RepeatedCompositeFieldContainer[NamedToken]
    tool_markers: ToolMarkers
    reasoning_markers: ReasoningMarkers
    def __init__(self, tokenizer_json: _Optional[str] = ..., chat_template: _Optional[str] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., special_tokens: _Optional[_Iterable[str]] = ..., sampling: _Optional[_Union[SamplingDefaults, _Mapping]] = ..., tool_parser: _Optional[_Union[ToolParser, str]] = ..., reasoning_parser: _Optional[_Union[ReasoningParser, str]] = ..., named_special_tokens: _Optional[_Iterable[_Union[NamedToken, _Mapping]]] = ..., tool_markers: _Optional[_Union[ToolMarkers, _Mapping]] = ..., reasoning_markers: _Optional[_Union[ReasoningMarkers, _Mapping]] = ...) -> None: ...

class BufferWrite(_message.Message):
    __slots__ = ("buffer", "offset", "data")
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    buffer: str
    offset: int
    data: bytes
    def __init__(self, buffer: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class BufferDigest(_message.Message):
    __slots__ = ("buffer", "sha256")
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    buffer: str
    sha256: str
    def __init__(self, buffer: _Optional[str] = ..., sha256: _Optional[str] = ...) -> None: ...

class QualificationStep(_message.Message):
    __slots__ = ("graph", "writes", "digests")
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    WRITES_FIELD_NUMBER: _ClassVar[int]
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    graph: int
    writes: _containers.RepeatedCompositeFieldContainer[BufferWrite]
    digests: _containers.RepeatedCompositeFieldContainer[BufferDigest]
    def __init__(self, graph: _Optional[int] = ..., writes: _Optional[_Iterable[_Union[BufferWrite, _Mapping]]] = ..., digests: _Optional[_Iterable[_Union[BufferDigest, _Mapping]]] = ...) -> None: ...

class Qualification(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[QualificationStep]
    def __init__(self, steps: _Optional[_Iterable[_Union[QualificationStep, _Mapping]]] = ...) -> None: ...
