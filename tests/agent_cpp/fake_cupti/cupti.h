/* A stand-in for CUPTI's callback API, enough for outside.cpp to compile
   and run without a GPU (tests/agent_cpp/outside_test.cpp): subscribing
   keeps the callback for the test to call, and a second subscriber is
   refused as CUPTI before 13.2 refuses it. With FAKE_CUPTI_13_2
   (outside_multi_test.cpp) it is CUPTI 13.2's: cuptiSubscribe_v2 with
   allowMultipleSubscribers, a subscriber let in beside others when they
   and it all allow it (as CUPTI's documentation of the field says). Names
   and layouts follow cupti_callbacks.h. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CUPTIAPI
typedef enum { CUPTI_SUCCESS = 0, CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39 } CUptiResult;
typedef enum { CUPTI_CB_DOMAIN_DRIVER_API = 1, CUPTI_CB_DOMAIN_RESOURCE = 3 } CUpti_CallbackDomain;
typedef uint32_t CUpti_CallbackId;
typedef enum { CUPTI_API_ENTER = 0, CUPTI_API_EXIT = 1 } CUpti_ApiCallbackSite;
typedef enum { CUPTI_CBID_RESOURCE_MODULE_LOADED = 4 } CUpti_CallbackIdResource;
typedef struct {
    CUpti_ApiCallbackSite callbackSite;
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
} CUpti_CallbackData;
typedef struct CUpti_Subscriber_st *CUpti_SubscriberHandle;
typedef void (*CUpti_CallbackFunc)(void *, CUpti_CallbackDomain, CUpti_CallbackId, const void *);

/* What the test reads: the subscriber's callback, and how many are on. */
static CUpti_CallbackFunc fake_cupti_callback = 0;
static int fake_cupti_subscribers = 0;
static int fake_cupti_other_client = 0; /* another client (the profiler) holds CUPTI */
static int fake_cupti_enabled = 0;
static const char *fake_cupti_names[] = {"", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemCreate", "cuMemRelease",
                                         "cuMemHostAlloc", "cuMemFreeHost", "cuStreamCreate", "cuLaunchKernel"};

static inline CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *s, CUpti_CallbackFunc f, void *u) {
    (void)u;
    if (fake_cupti_subscribers > 0 || fake_cupti_other_client) return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    fake_cupti_subscribers++;
    fake_cupti_callback = f;
    *s = (CUpti_SubscriberHandle)&fake_cupti_callback;
    return CUPTI_SUCCESS;
}
static int fake_cupti_ours_multi = 0; /* our subscriber allowed others beside it */
static inline CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle s) {
    (void)s;
    fake_cupti_subscribers--;
    fake_cupti_ours_multi = 0;
    fake_cupti_callback = 0;
    return CUPTI_SUCCESS;
}

#ifdef FAKE_CUPTI_13_2
#define CUPTI_API_VERSION 130200
typedef struct {
    size_t structSize;
    const char *subscriberName;
    char *oldSubscriberName;
    size_t oldSubscriberSize;
    uint8_t allowMultipleSubscribers;
} CUpti_SubscriberParams;
static int fake_cupti_asked_multi = -1; /* what the last cuptiSubscribe_v2 asked */
/* fake_cupti_other_client: 1 holds CUPTI alone, 2 holds it and allows others. */
static inline CUptiResult cuptiSubscribe_v2(CUpti_SubscriberHandle *s, CUpti_CallbackFunc f, void *u,
                                            CUpti_SubscriberParams *p) {
    (void)u;
    int multi = p && p->structSize >= sizeof *p && p->allowMultipleSubscribers;
    fake_cupti_asked_multi = multi;
    if (fake_cupti_subscribers > 0 || fake_cupti_other_client == 1 || (fake_cupti_other_client == 2 && !multi))
        return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    fake_cupti_subscribers++;
    fake_cupti_ours_multi = multi;
    fake_cupti_callback = f;
    *s = (CUpti_SubscriberHandle)&fake_cupti_callback;
    return CUPTI_SUCCESS;
}
#endif

/* The other client (the profiler) subscribing: allowing others or not. */
static inline CUptiResult fake_cupti_other_subscribe(int multi) {
    if (fake_cupti_other_client || (fake_cupti_subscribers > 0 && !(multi && fake_cupti_ours_multi)))
        return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    fake_cupti_other_client = multi ? 2 : 1;
    return CUPTI_SUCCESS;
}
static inline CUptiResult cuptiEnableCallback(uint32_t on, CUpti_SubscriberHandle s, CUpti_CallbackDomain d,
                                              CUpti_CallbackId id) {
    (void)s;
    (void)d;
    (void)id;
    fake_cupti_enabled += on ? 1 : 0;
    return CUPTI_SUCCESS;
}
static inline CUptiResult cuptiGetCallbackName(CUpti_CallbackDomain d, uint32_t id, const char **name) {
    if (d != CUPTI_CB_DOMAIN_DRIVER_API || id >= sizeof fake_cupti_names / sizeof fake_cupti_names[0] || id == 0)
        return (CUptiResult)1;
    *name = fake_cupti_names[id];
    return CUPTI_SUCCESS;
}
static inline CUptiResult cuptiGetResultString(CUptiResult r, const char **s) {
    *s = r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED ? "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
                                                             : "CUPTI error";
    return CUPTI_SUCCESS;
}
