#include "config.h"
#include "framework/nn/nn.h"
#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"
#include "io/formats/safetensors.h"
#include "models/models.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static const char *mods[]={"bn1","maxpool","layer1.0.bn1","layer1.0","layer1.1.bn1","layer1.1","layer2.0.bn1","layer2.0","layer2.1.bn1","layer2.1","layer3.0.bn1","layer3.0","layer3.1.bn1","layer3.1","layer4.0.bn1","layer4.0","layer4.1.bn1","layer4.1"};
int main(void) {
  ch_model_options_t o; ch_model_options_default(&o); o.num_classes=10; o.in_channels=1;
  ch_model_t *m; ch_compute_t *cx; ch_safetensors_t *st, *bt;
  if (ch_model_create("resnet18",&o,&m) || ch_compute_create(NULL, &cx) || ch_safetensors_open("init.safetensors", &st) || ch_safetensors_open("batch.safetensors", &bt)) { printf("%s\n", ch_error_message()); return 1;}
  int ne=ch_model_num_entries(m);
  for (int i=0;i<ne;i++){ ch_param_t*e=ch_model_entry(m,i); size_t b=e->numel*(e->dtype==CH_I64?8:4);
    if (ch_safetensors_read_into(st,e->name,e->dtype==CH_I64?CH_ST_I64:CH_ST_F32,e->ndim,e->shape,e->data,b)) {printf("%s\n",ch_error_message());return 1;}}
  const ch_st_view_t *xv=ch_safetensors_find(bt,"x"), *yv=ch_safetensors_find(bt,"y");
  ch_tensor_t x,y; ch_tensor_alloc_f32(&x,4,xv->shape); memcpy(x.data,xv->data,xv->nbytes);
  ch_tensor_alloc(&y,CH_I64,1,yv->shape,CH_LAYOUT_PLAIN,CH_DEV_CPU,0); memcpy(y.data,yv->data,yv->nbytes);
  ch_model_train(m,1); const ch_tensor_t *lg;
  if (ch_model_forward(m,cx,&x,&lg)) {printf("%s\n",ch_error_message());return 1;}
  int nm=sizeof mods/sizeof *mods; ch_st_view_t v[64]; ch_tensor_t t[64]; int k=0;
  for (int i=0;i<nm;i++){ const ch_tensor_t *a=ch_model_activation(m,mods[i]); if(!a){printf("no %s\n",mods[i]);continue;}
    ch_tensor_alloc_f32(&t[k],a->ndim,a->shape);
    if (a->layout!=CH_LAYOUT_PLAIN) { if(ch_op_reorder(cx,a,&t[k])){printf("%s\n",ch_error_message());return 1;} } else memcpy(t[k].data,a->data,ch_tensor_numel(a)*4);
    v[k].name=mods[i]; v[k].dtype=CH_ST_F32; v[k].ndim=a->ndim; for(int d=0;d<a->ndim;d++) v[k].shape[d]=a->shape[d]; v[k].data=t[k].data; v[k].nbytes=ch_tensor_numel(a)*4; k++;}
  if (ch_safetensors_write("cact2.safetensors",v,k,NULL,0)) printf("%s\n",ch_error_message());
  return 0; }
